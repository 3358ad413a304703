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


@dataclass
class BadRecord:
    line: int
    reason: str
    raw: str
    """The record's text as read (undecodable bytes replaced)."""
    field: str | None = None
