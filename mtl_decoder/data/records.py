"""A record read from a file, or one that could not be read: what every format reader yields (formats.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Record:
    line: int
    """1-based line the record starts on (the first line of a CoNLL sentence; the row for parquet)."""
    data: dict[str, Any]
    raw: str = ""
    """The record's text as read, for line-based formats (what an errors file shows)."""
    text_cells: bool = False
    """Its values are cells of text (CSV/TSV), where a list of words may be written as one space-separated cell."""
    word_lines: list[int] | None = None
    """CoNLL: the line of each word, so that an error about one word names that word's line."""
    columns: dict[str, str] | None = None
    """CoNLL: field -> the column it was read from, as errors name it (a .conll file has no field names)."""


@dataclass
class BadRecord:
    line: int
    reason: str
    raw: str
    """The record's text as read (undecodable bytes replaced)."""
    field: str | None = None
