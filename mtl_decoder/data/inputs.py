"""Input files for prediction, read as a stream through the one file-format layer (``mtl_decoder.data.formats``):
one record at a time, each with the line it starts on.

A bad record does not raise: it comes out as a ``BadRecord`` (line, reason, raw text) so the caller decides
whether to stop or to set it aside. Only problems with the file as a whole (not found, unknown format, a CSV
header without the text column) raise ``DataError``.

What the model reads from a record: .jsonl a ``tokens`` list, or else the text field (every field kept); .csv
and .tsv the text column; .txt the line; .conll the tokens of a sentence (the other columns kept as
``columns``).

A record that has a field (or a CSV/TSV column) named ``predictions`` is a bad record: that is the field the
output adds, and the input's own value would be lost under it. Rename or drop it in the input (e.g. predicting
again on an earlier output: drop its ``predictions``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtl_decoder.data.formats import BadRecord, FileRecords, detect_format

PREDICTIONS = "predictions"
"""The field each output record gets (prediction/outputs.py); an input record that already has one is refused (never
overwritten)."""

TOKENS = "tokens"
RESERVED_REASON = "the output writes its predictions under this name; rename or drop the field in the input"

__all__ = ["TOKENS", "BadRecord", "InputReader", "InputRecord", "check_text", "check_tokens"]


@dataclass
class InputRecord:
    line: int
    """1-based line the record starts on."""
    fields: dict[str, Any]
    """The record's own fields, written back with the predictions."""
    item: str | list[str]
    """What the model reads: a raw text or a token list."""


def check_text(value: Any) -> str | None:
    """Why ``value`` cannot be predicted on as a raw text, or None."""
    if not isinstance(value, str):
        return f"must be a string, got {_kind(value)}"
    if not value.strip():
        return "is empty"
    return _check_encodable(value)


def check_tokens(value: Any) -> str | None:
    """Why ``value`` cannot be predicted on as a token list, or None."""
    if not isinstance(value, list):
        return f"must be a list of strings, got {_kind(value)}"
    if not value:
        return "is an empty list"
    for i, token in enumerate(value):
        if not isinstance(token, str):
            return f"token {i} is {_kind(token)}, not a string"
        if not token.strip():
            return f"token {i} is empty or whitespace"
        reason = _check_encodable(token)
        if reason:
            return f"token {i} {reason}"
    return None


def _check_encodable(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"contains a lone surrogate (\\u{ord(text[err.start]):04x})"
    return None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class InputReader:
    """Iterates ``InputRecord``s and ``BadRecord``s of one file; ``empty_lines`` counts the empty lines skipped."""

    def __init__(self, path: str | Path, fmt: str | None = None, text_column: str = "text"):
        fmt = detect_format(path, fmt, prediction=True)
        required = (text_column,) if fmt in ("csv", "tsv") else ()
        self.records = FileRecords(path, fmt, prediction=True, required_columns=required, conll_tags=False)
        self.path, self.fmt, self.text_column = self.records.path, fmt, text_column

    @property
    def empty_lines(self) -> int:
        return self.records.empty_lines

    def __iter__(self) -> Iterator[InputRecord | BadRecord]:
        pick = self._pick_tokens_or_text if self.fmt == "jsonl" else self._pick_fixed
        for record in self.records:
            if isinstance(record, BadRecord):
                yield record
            elif PREDICTIONS in record.data:
                yield BadRecord(record.line, RESERVED_REASON, record.raw, PREDICTIONS)
            else:
                yield pick(record.line, record.data, record.raw)

    def _pick_fixed(self, line: int, data: dict[str, Any], raw: str) -> InputRecord | BadRecord:
        """csv/tsv: the text column; txt: the line ('text'); conll: the tokens."""
        if self.fmt == "conll":
            reason = check_tokens(data[TOKENS])
            if reason:
                return BadRecord(line, reason, raw, TOKENS)
            return InputRecord(line, data, data[TOKENS])
        column = "text" if self.fmt == "txt" else self.text_column
        reason = check_text(data[column])
        if reason:
            return BadRecord(line, f"text {reason}" if self.fmt == "txt" else reason, raw, column)
        return InputRecord(line, data, data[column])

    def _pick_tokens_or_text(self, line: int, data: dict[str, Any], raw: str) -> InputRecord | BadRecord:
        if "\\ud" in raw.lower():  # a lone surrogate can only come from a \u escape; it could not be written out
            reason = _check_encodable(json.dumps(data, ensure_ascii=False))
            if reason:
                return BadRecord(line, f"the record {reason}", raw)
        if data.get(TOKENS) is not None:
            reason = check_tokens(data[TOKENS])
            if reason:
                return BadRecord(line, reason, raw, TOKENS)
            return InputRecord(line, data, data[TOKENS])
        if self.text_column not in data:
            return BadRecord(line, f"no '{TOKENS}' or '{self.text_column}' field", raw)
        reason = check_text(data[self.text_column])
        if reason:
            return BadRecord(line, reason, raw, self.text_column)
        return InputRecord(line, data, data[self.text_column])
