"""File formats: users' files turned into records.

File formats: the one layer that turns the files users have into records, for training data and prediction
inputs alike, as a stream, each record with the line it starts on.

| format  | suffixes               | training | prediction | what a record is                                       |
| ------- | ---------------------- | -------- | ---------- | ------------------------------------------------------ |
| jsonl   | .jsonl .ndjson         | yes      | yes        | a JSON object per line                                 |
| json    | .json                  | yes      | no         | an element of a top-level JSON array of objects        |
| csv     | .csv                   | yes      | yes        | a row (RFC 4180: quoted fields may hold , " and lines)  |
| tsv     | .tsv                   | yes      | yes        | a line (IANA TSV: no quoting, quotes are plain text)   |
| parquet | .parquet               | yes      | no         | a row                                                  |
| txt     | .txt .text             | no       | yes        | a line of text                                         |
| conll   | .conll .bio .iob       | yes      | yes        | a sentence: a token per line, blank line between       |

``FileRecords`` never raises for one bad record: it yields a ``BadRecord`` (line, reason, raw text) and goes on,
so the caller decides whether to stop (training data: ``RecordReader`` raises a ``DataError`` naming file, line
and field) or to set it aside (``predict --on-error skip``). Problems with the file as a whole (not found, a
folder, unknown format, a CSV header without a needed column) raise ``DataError``. Hostile input stays one
record's problem: lines are bounded in length, JSON in nesting depth, and a CSV quote left open is reported at
the line where it began, the rows after it read normally. ``Record`` and ``BadRecord`` are in records.py, the .json
reader in json_array.py.
"""

from __future__ import annotations

import codecs
import csv
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtl_decoder.data.json_array import read_json_array
from mtl_decoder.data.records import BadRecord, Record
from mtl_decoder.data.safejson import json_list_cell, parse_json_object
from mtl_decoder.errors import DataError
from mtl_decoder.files import path_problem

MAX_LINE_BYTES = 1 << 20
"""Longest line read (1 MiB); a longer one is a bad record, not a reason to fill memory."""


@dataclass(frozen=True)
class Format:
    name: str
    suffixes: tuple[str, ...]
    training: bool
    """Can hold labelled task data."""
    prediction: bool
    """Can be predicted on."""


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("jsonl", (".jsonl", ".ndjson"), True, True),
        Format("json", (".json",), True, False),
        Format("csv", (".csv",), True, True),
        Format("tsv", (".tsv",), True, True),
        Format("parquet", (".parquet",), True, False),
        Format("txt", (".txt", ".text"), False, True),
        Format("conll", (".conll", ".bio", ".iob"), True, True),
    )
}
TRAINING_FORMATS = tuple(f.name for f in FORMATS.values() if f.training)
PREDICTION_FORMATS = tuple(f.name for f in FORMATS.values() if f.prediction)


STDIN = "-"
"""The path that means standard input (predict --input -); read as a stream, so in a line-based format only."""
STDIN_FORMATS = ("jsonl", "csv", "tsv", "txt", "conll")


def detect_format(path: str | Path, fmt: str | None = None, prediction: bool = False) -> str:
    """The format of ``path``: ``fmt`` when given, else from the suffix; only formats usable for the purpose."""
    if str(path) == STDIN and prediction:
        if fmt not in STDIN_FORMATS:
            said = f"cannot be read as --format {fmt} (not a stream)" if fmt else "has no suffix to say its format"
            raise DataError("--input -", None, f"standard input {said}; give --format {' | '.join(STDIN_FORMATS)}")
        return fmt
    problem = path_problem(path)
    if problem and problem != "file not found":  # before the suffix: a folder has none, and its name is the problem
        raise DataError(str(path), None, problem + ("; give the path of a file in it" if "folder" in problem else ""))
    usable = PREDICTION_FORMATS if prediction else TRAINING_FORMATS
    hint = "; use --format to say which" if prediction else ""
    if fmt is not None:
        if fmt not in usable:
            raise DataError(str(path), None, f"unknown format '{fmt}' (expected one of {', '.join(usable)})")
        return fmt
    suffix = Path(path).suffix.lower()
    found = next((f.name for f in FORMATS.values() if suffix in f.suffixes and f.name in usable), None)
    if found is None:
        raise DataError(str(path), None, f"unknown file format '{suffix}' (expected one of {', '.join(usable)}){hint}")
    return found


@dataclass
class _Line:
    number: int
    text: str
    """Decoded text, line break included."""
    error: str | None


def _chomp(text: str) -> str:
    return text.rstrip("\r\n")


def _raw(lines: list[_Line]) -> str:
    return _chomp("".join(line.text for line in lines))


class FileRecords:
    """The ``Record``s and ``BadRecord``s of one file, streamed; ``empty_lines`` counts the empty lines skipped.

    ``required_columns``: CSV/TSV columns whose absence from the header is an error for the whole file.
    ``tokens_key``/``tags_key``: the fields a CoNLL sentence's tokens and (with ``conll_tags``) last-column tags
    go to; without ``conll_tags`` the columns after the token are kept as ``columns``.
    """

    def __init__(
        self,
        path: str | Path,
        fmt: str | None = None,
        prediction: bool = False,
        required_columns: tuple[str, ...] = (),
        tokens_key: str = "tokens",
        tags_key: str = "tags",
        conll_tags: bool = True,
    ):
        self.path = str(path)
        self.fmt = detect_format(path, fmt, prediction)
        self.required_columns = required_columns
        self.tokens_key, self.tags_key, self.conll_tags = tokens_key, tags_key, conll_tags
        self.empty_lines = 0
        problem = None if self.path == STDIN else path_problem(self.path)
        if problem:  # a named pipe is fine: every reader but .json streams
            raise DataError(self.path, None, problem)

    def __iter__(self) -> Iterator[Record | BadRecord]:
        self.empty_lines = 0
        readers = {
            "jsonl": self._read_jsonl,
            "json": lambda: read_json_array(self.path),
            "csv": lambda: self._read_delimited(","),
            "tsv": lambda: self._read_delimited("\t"),
            "parquet": self._read_parquet,
            "txt": self._read_txt,
            "conll": self._read_conll,
        }
        return readers[self.fmt]()

    # ------------------------------------------------------------------------------------------ lines

    def _lines(self) -> Iterator[_Line]:
        """Decoded lines; a line that is not UTF-8 or too long carries its error (its text is still given)."""
        with open(self.path, "rb") if self.path != STDIN else open(sys.stdin.fileno(), "rb", closefd=False) as f:
            number = 0
            while True:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                number += 1
                error = None
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    while raw[-1:] != b"\n":  # skip to the end of the line, keeping only its start
                        rest = f.readline(MAX_LINE_BYTES)
                        if not rest:
                            break
                        raw = raw[:1024] + rest[-1:]
                    error = f"line longer than {MAX_LINE_BYTES:,} bytes"
                    raw = raw[:1024] + b"\n"
                if number == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8) :]
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    text = raw.decode("utf-8", "replace")
                    error = error or f"not valid UTF-8 ({err.reason} at byte {err.start + 1})"
                yield _Line(number, text, error)

    # ------------------------------------------------------------------------------------------ txt / jsonl

    def _read_txt(self) -> Iterator[Record | BadRecord]:
        for line in self._lines():
            text = _chomp(line.text)
            if not text.strip():
                self.empty_lines += 1
            elif line.error:
                yield BadRecord(line.number, line.error, text)
            else:
                yield Record(line.number, {"text": text}, text)

    def _read_jsonl(self) -> Iterator[Record | BadRecord]:
        for line in self._lines():
            text = _chomp(line.text)
            if not text.strip():
                self.empty_lines += 1
                continue
            if line.error:
                yield BadRecord(line.number, line.error, text)
                continue
            data, reason = parse_json_object(text)
            yield BadRecord(line.number, reason, text) if data is None else Record(line.number, data, text)

    # ------------------------------------------------------------------------------------------ csv / tsv

    def _read_delimited(self, delimiter: str) -> Iterator[Record | BadRecord]:
        lines = self._lines()
        pushed: deque[_Line] = deque()  # lines to read again: those after an unclosed quote's first line
        consumed: list[_Line] = []  # the lines of the row being parsed (a quoted field may span lines)

        def feed() -> Iterator[str]:
            while True:
                line = pushed.popleft() if pushed else next(lines, None)
                if line is None:
                    return
                consumed.append(line)
                yield line.text

        def reader():
            if delimiter == "\t":  # IANA TSV: a row per line, no quoting (quotes are ordinary characters)
                return csv.reader(feed(), delimiter="\t", quoting=csv.QUOTE_NONE)
            return csv.reader(feed(), delimiter=delimiter, strict=True)

        rows = reader()
        header = self._header(rows, consumed)
        while True:
            consumed.clear()
            try:
                row = next(rows)
            except StopIteration:
                return
            except csv.Error as err:
                if len(consumed) > 1:
                    # A quote opened on consumed[0] never closed (the data ended, or a later quote is not followed
                    # by a delimiter): that line is the bad record; the lines after it are read again as rows.
                    first, rest = consumed[0], consumed[1:]
                    pushed.extendleft(reversed(rest))
                    rows = reader()
                    yield BadRecord(
                        first.number, "a quoted field opened on this line is never closed", _chomp(first.text)
                    )
                    continue
                yield BadRecord(consumed[0].number, f"malformed {self.fmt.upper()} ({err})", _raw(consumed))
                continue
            if not any(cell.strip() for cell in row):
                self.empty_lines += len(consumed)
                continue
            yield self._row_record(header, row, consumed)

    def _header(self, rows, consumed: list[_Line]) -> list[str]:
        try:
            header = next(rows, None)
        except csv.Error as err:
            raise DataError(self.path, 1, f"malformed {self.fmt.upper()} header ({err})") from None
        if not header or all(not cell.strip() for cell in header):
            raise DataError(self.path, 1, "missing header row")
        if any(line.error for line in consumed):
            raise DataError(self.path, 1, f"header: {next(line.error for line in consumed if line.error)}")
        header = [cell.strip() for cell in header]
        if len(set(header)) != len(header):
            raise DataError(self.path, 1, "repeated column names in the header")
        for column in self.required_columns:
            if column not in header:
                raise DataError(self.path, 1, f"no column '{column}' (columns: {', '.join(header)}); use --text-column")
        return header

    def _row_record(self, header: list[str], row: list[str], consumed: list[_Line]) -> Record | BadRecord:
        number, raw = consumed[0].number, _raw(consumed)
        error = next((line.error for line in consumed if line.error), None)
        if error:
            return BadRecord(number, error, raw)
        if len(row) != len(header):
            return BadRecord(number, f"expected {len(header)} fields, got {len(row)}", raw)
        return Record(number, dict(zip(header, row, strict=True)), raw, text_cells=True)

    # ------------------------------------------------------------------------------------------ parquet

    def _read_parquet(self) -> Iterator[Record | BadRecord]:
        import pyarrow.parquet as pq  # installed with datasets; imported here to keep start-up light

        try:
            batches = pq.ParquetFile(self.path).iter_batches(batch_size=1024)
        except Exception as err:  # pyarrow raises ArrowInvalid/OSError for a file that is not parquet
            raise DataError(self.path, None, f"cannot read as parquet ({err})") from None
        row = 0
        for batch in batches:
            for data in batch.to_pylist():
                row += 1
                yield Record(row, data)

    # ------------------------------------------------------------------------------------------ conll

    def _read_conll(self) -> Iterator[Record | BadRecord]:
        self._conll_columns: dict[int, dict[str, str]] = {}  # columns per line width, shared by its records
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

    def _conll_record(self, lines: list[_Line]) -> Record | BadRecord:
        raw = _raw(lines)
        bad = next((line for line in lines if line.error), None)
        if bad:
            return BadRecord(bad.number, bad.error or "", raw)
        cols = [_chomp(line.text).split("\t") if "\t" in line.text else line.text.split() for line in lines]
        cols = [[c.strip() for c in row] for row in cols]
        data: dict[str, Any] = {self.tokens_key: [c[0] for c in cols]}
        widths = {len(c) for c in cols}
        if self.conll_tags:
            if len(widths) > 1:
                first = next(i for i, c in enumerate(cols) if len(c) != len(cols[0]))
                return BadRecord(lines[first].number, "every token line of a sentence needs the same columns", raw)
            if widths != {1}:
                data[self.tags_key] = [c[-1] for c in cols]
        elif widths != {1}:
            data["columns"] = [c[1:] for c in cols]
        width = max(widths)
        if width not in self._conll_columns:
            self._conll_columns[width] = {self.tokens_key: "column 1 (the word)"}
            if width > 1:
                self._conll_columns[width][self.tags_key] = f"column {width} (the tag)"
        word_lines = [line.number for line in lines]
        return Record(lines[0].number, data, raw, word_lines=word_lines, columns=self._conll_columns[width])


class RecordReader:
    """The training records of one file.

    Training data: the records of one file, the first bad one raised as a ``DataError`` (file, line, field);
    CSV/TSV cells that hold JSON lists become lists. ``empty_lines`` counts what was skipped."""

    def __init__(self, path: str | Path, fmt: str | None = None, tokens_key: str = "tokens", tags_key: str = "tags"):
        self.records = FileRecords(path, fmt, tokens_key=tokens_key, tags_key=tags_key)
        self.path, self.fmt = self.records.path, self.records.fmt

    @property
    def empty_lines(self) -> int:
        return self.records.empty_lines

    def __iter__(self) -> Iterator[Record]:
        delimited = self.fmt in ("csv", "tsv")
        for record in self.records:
            if isinstance(record, BadRecord):
                raise DataError(self.path, record.line, record.reason, record.field)
            if delimited:
                record.data = {k: json_list_cell(v) for k, v in record.data.items()}
            yield record
