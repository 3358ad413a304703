"""Input files for prediction, read as a stream: one record at a time, each with the line it starts on.

Unlike the training readers, a bad record does not raise: it comes out as a ``BadRecord`` (line, reason, raw
text) so the caller decides whether to stop or to set it aside. Only problems with the file as a whole (not
found, unknown format, a CSV header without the text column) raise ``DataError``.

Formats: .jsonl (a ``tokens`` list, or else a text field; every field kept), .csv (RFC 4180 quoting, strict) and
.tsv (one line per row, no quoting) with a text column, .txt (a text per line), .conll (a token per line in
the first column, blank line between sentences). Files are read as bytes and decoded line by line, so a line
that is not UTF-8 is one bad record, not the end of the run.
"""

from __future__ import annotations

import codecs
import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtl_decoder.errors import DataError

FORMATS = ("jsonl", "csv", "tsv", "txt", "conll")
_ALIASES = {"ndjson": "jsonl", "text": "txt", "bio": "conll", "iob": "conll"}
TOKENS = "tokens"


@dataclass
class InputRecord:
    line: int
    """1-based line the record starts on."""
    fields: dict[str, Any]
    """The record's own fields, written back with the predictions."""
    item: str | list[str]
    """What the model reads: a raw text or a token list."""


@dataclass
class BadRecord:
    line: int
    reason: str
    raw: str
    """The record's text as read (undecodable bytes replaced)."""
    field: str | None = None


@dataclass
class _Line:
    number: int
    text: str
    """Decoded text, line break included."""
    error: str | None


def detect_format(path: str | Path, fmt: str | None = None) -> str:
    """The input format: ``fmt`` if given, else from the file's suffix."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise DataError(str(path), None, f"unknown format '{fmt}' (expected one of {', '.join(FORMATS)})")
        return fmt
    suffix = Path(path).suffix.lower().lstrip(".")
    found = _ALIASES.get(suffix, suffix)
    if found not in FORMATS:
        raise DataError(
            str(path), None, f"cannot tell the format from '.{suffix}': use --format ({', '.join(FORMATS)})"
        )
    return found


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
        self.path = str(path)
        self.fmt = detect_format(path, fmt)
        self.text_column = text_column
        self.empty_lines = 0
        if not Path(self.path).is_file():
            raise DataError(self.path, None, "file not found")

    def __iter__(self) -> Iterator[InputRecord | BadRecord]:
        self.empty_lines = 0
        readers = {
            "jsonl": self._read_jsonl,
            "csv": lambda: self._read_delimited(","),
            "tsv": lambda: self._read_delimited("\t"),
            "txt": self._read_txt,
            "conll": self._read_conll,
        }
        return readers[self.fmt]()

    # ------------------------------------------------------------------------------------------ lines

    def _lines(self) -> Iterator[_Line]:
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, 1):
                if number == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8) :]
                try:
                    yield _Line(number, raw.decode("utf-8"), None)
                except UnicodeDecodeError as err:
                    yield _Line(number, raw.decode("utf-8", "replace"), f"not valid UTF-8 (byte {err.start + 1})")

    # ------------------------------------------------------------------------------------------ txt

    def _read_txt(self) -> Iterator[InputRecord | BadRecord]:
        for line in self._lines():
            text = _chomp(line.text)
            if not text.strip():
                self.empty_lines += 1
            elif line.error:
                yield BadRecord(line.number, line.error, text)
            elif reason := check_text(text):
                yield BadRecord(line.number, f"text {reason}", text)
            else:
                yield InputRecord(line.number, {"text": text}, text)

    # ------------------------------------------------------------------------------------------ jsonl

    def _read_jsonl(self) -> Iterator[InputRecord | BadRecord]:
        for line in self._lines():
            text = _chomp(line.text)
            if not text.strip():
                self.empty_lines += 1
            elif line.error:
                yield BadRecord(line.number, line.error, text)
            else:
                yield self._json_record(line.number, text)

    def _json_record(self, number: int, text: str) -> InputRecord | BadRecord:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            return BadRecord(number, f"malformed JSON ({err.msg} at column {err.colno})", text)
        if not isinstance(data, dict):
            return BadRecord(number, f"expected a JSON object, got {_json_kind(data)}", text)
        if "\\ud" in text.lower():  # a lone surrogate can only come from a \u escape; it could not be written out
            reason = _check_encodable(json.dumps(data, ensure_ascii=False))
            if reason:
                return BadRecord(number, f"the record {reason}", text)
        return self._pick_item(number, data, text)

    def _pick_item(self, number: int, data: dict[str, Any], raw: str) -> InputRecord | BadRecord:
        if data.get(TOKENS) is not None:
            reason = check_tokens(data[TOKENS])
            if reason:
                return BadRecord(number, reason, raw, TOKENS)
            return InputRecord(number, data, data[TOKENS])
        if self.text_column not in data:
            return BadRecord(number, f"no '{TOKENS}' or '{self.text_column}' field", raw)
        reason = check_text(data[self.text_column])
        if reason:
            return BadRecord(number, reason, raw, self.text_column)
        return InputRecord(number, data, data[self.text_column])

    # ------------------------------------------------------------------------------------------ csv / tsv

    def _read_delimited(self, delimiter: str) -> Iterator[InputRecord | BadRecord]:
        consumed: list[_Line] = []  # the lines of the row being parsed (a quoted field may span lines)

        def feed() -> Iterator[str]:
            for line in self._lines():
                consumed.append(line)
                yield line.text

        if delimiter == "\t":  # TSV: a row per line, no quoting (quotes are ordinary characters)
            reader = csv.reader(feed(), delimiter="\t", quoting=csv.QUOTE_NONE)
        else:
            reader = csv.reader(feed(), delimiter=delimiter, strict=True)
        header = self._header(reader, consumed)
        while True:
            consumed.clear()
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                yield BadRecord(consumed[0].number, f"malformed CSV ({err})", _raw(consumed))
                continue
            if not any(cell.strip() for cell in row):
                self.empty_lines += len(consumed)
                continue
            yield self._row_record(header, row, consumed)

    def _header(self, reader, consumed: list[_Line]) -> list[str]:
        try:
            header = next(reader, None)
        except csv.Error as err:
            raise DataError(self.path, 1, f"malformed CSV header ({err})") from None
        if not header:
            raise DataError(self.path, 1, "missing header row")
        if any(line.error for line in consumed):
            raise DataError(self.path, 1, f"header: {consumed[0].error}")
        header = [h.strip() for h in header]
        if len(set(header)) != len(header):
            raise DataError(self.path, 1, "repeated column names in the header")
        if self.text_column not in header:
            raise DataError(
                self.path, 1, f"no column '{self.text_column}' (columns: {', '.join(header)}); use --text-column"
            )
        return header

    def _row_record(self, header: list[str], row: list[str], consumed: list[_Line]) -> InputRecord | BadRecord:
        number, raw = consumed[0].number, _raw(consumed)
        error = next((line.error for line in consumed if line.error), None)
        if error:
            return BadRecord(number, error, raw)
        if len(row) != len(header):
            return BadRecord(number, f"expected {len(header)} fields, got {len(row)}", raw)
        fields = dict(zip(header, row, strict=True))
        reason = check_text(fields[self.text_column])
        if reason:
            return BadRecord(number, reason, raw, self.text_column)
        return InputRecord(number, fields, fields[self.text_column])

    # ------------------------------------------------------------------------------------------ conll

    def _read_conll(self) -> Iterator[InputRecord | BadRecord]:
        sentence: list[_Line] = []
        after_docstart = False
        for line in self._lines():
            text = _chomp(line.text)
            if text.strip():
                after_docstart = text.split()[0] == "-DOCSTART-"
                if not after_docstart:
                    sentence.append(line)
                continue
            if sentence:
                yield self._conll_record(sentence)
                sentence = []
            elif not after_docstart:
                self.empty_lines += 1
            after_docstart = False
        if sentence:
            yield self._conll_record(sentence)

    def _conll_record(self, lines: list[_Line]) -> InputRecord | BadRecord:
        raw = _raw(lines)
        bad = next((line for line in lines if line.error), None)
        if bad:
            return BadRecord(bad.number, bad.error or "", raw)
        rows = [_chomp(line.text) for line in lines]
        cols = [row.split("\t") if "\t" in row else row.split() for row in rows]
        tokens = [c[0].strip() for c in cols]
        reason = check_tokens(tokens)
        if reason:
            return BadRecord(lines[0].number, reason, raw, TOKENS)
        fields: dict[str, Any] = {TOKENS: tokens}
        if any(len(c) > 1 for c in cols):
            fields["columns"] = [c[1:] for c in cols]
        return InputRecord(lines[0].number, fields, tokens)


def _chomp(text: str) -> str:
    """The line without its line break."""
    return text.rstrip("\r\n")


def _raw(lines: list[_Line]) -> str:
    return _chomp("".join(line.text for line in lines))


def _json_kind(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
