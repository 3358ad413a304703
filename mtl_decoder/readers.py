"""Read records from the files users already have, as a stream, each with the line it came from.

Formats by suffix: .jsonl, .json (an array of objects), .csv, .tsv, .parquet, .conll (a token per line,
blank line between sentences), or a Hugging Face dataset through ``datasets.load_dataset``. Every bad
record raises a DataError naming the file and line. Empty lines are skipped and counted.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtl_decoder.errors import DataError

FORMATS = ("jsonl", "json", "csv", "tsv", "parquet", "conll")


@dataclass
class Record:
    line: int
    """1-based line of the record in its file (the first line of a CoNLL sentence; the row for parquet)."""
    data: dict[str, Any]


def detect_format(path: str | Path) -> str:
    suffix = Path(path).suffix.lower().lstrip(".")
    aliases = {"ndjson": "jsonl", "bio": "conll", "iob": "conll"}
    fmt = aliases.get(suffix, suffix)
    if fmt not in FORMATS:
        raise DataError(str(path), None, f"unknown file format '.{suffix}' (expected one of {', '.join(FORMATS)})")
    return fmt


class RecordReader:
    """Iterates the records of one file; ``empty_lines`` counts what was skipped."""

    def __init__(self, path: str | Path, fmt: str | None = None, tokens_key: str = "tokens", tags_key: str = "tags"):
        self.path = str(path)
        self.fmt = fmt or detect_format(path)
        self.tokens_key, self.tags_key = tokens_key, tags_key
        self.empty_lines = 0
        if not Path(self.path).is_file():
            raise DataError(self.path, None, "file not found")

    def __iter__(self) -> Iterator[Record]:
        self.empty_lines = 0
        return getattr(self, f"_read_{self.fmt}")()

    def _open(self):
        # utf-8-sig: a byte-order mark (spreadsheet exports) must not become part of the first column's name
        return open(self.path, encoding="utf-8-sig", newline="")

    def _decode(self, raw: bytes, lineno: int) -> str:
        try:
            return raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise DataError(self.path, lineno, f"not valid UTF-8 ({err.reason} at byte {err.start + 1})") from None

    def _read_jsonl(self) -> Iterator[Record]:
        # Binary lines, decoded one at a time: a bad byte is reported with its line, and only '\n' ends a record.
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                line = self._decode(raw, lineno)
                if not line.strip():
                    self.empty_lines += 1
                    continue
                yield Record(lineno, self._parse_object(line.rstrip("\r\n"), lineno))

    def _parse_object(self, text: str, lineno: int) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(self.path, lineno, f"malformed JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(data, dict):
            raise DataError(self.path, lineno, f"expected a JSON object, got {type(data).__name__}")
        return data

    def _read_json(self) -> Iterator[Record]:
        # A JSON array cannot be streamed with the standard library; decode element by element to keep lines.
        try:
            text = Path(self.path).read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as err:
            raise DataError(self.path, None, f"not valid UTF-8 ({err.reason} at byte {err.start + 1})") from None
        decoder = json.JSONDecoder()
        pos = _skip_space(text, 0)
        if pos >= len(text) or text[pos] != "[":
            raise DataError(self.path, text.count("\n", 0, pos) + 1, "expected a JSON array of objects")
        lineno, counted = 1, 0  # line of text[counted], advanced incrementally (no rescans from the start)

        def line_at(p: int) -> int:
            nonlocal lineno, counted
            lineno += text.count("\n", counted, p)
            counted = p
            return lineno

        pos = _skip_space(text, pos + 1)
        first = True
        while pos < len(text) and text[pos] != "]":
            if not first:
                if text[pos] != ",":
                    raise DataError(self.path, line_at(pos), "malformed JSON (expected ',' or ']' after an object)")
                pos = _skip_space(text, pos + 1)
            first = False
            line = line_at(pos)
            try:
                data, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as err:
                raise DataError(self.path, err.lineno, f"malformed JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(data, dict):
                raise DataError(self.path, line, f"expected a JSON object, got {type(data).__name__}")
            yield Record(line, data)
            pos = _skip_space(text, pos)
        if pos >= len(text):
            raise DataError(self.path, text.count("\n") + 1, "malformed JSON (unterminated array)")
        if _skip_space(text, pos + 1) < len(text):
            raise DataError(self.path, line_at(pos), "malformed JSON (text after the closing ']')")

    def _read_csv(self) -> Iterator[Record]:
        yield from self._read_delimited(",")

    def _read_tsv(self) -> Iterator[Record]:
        yield from self._read_delimited("\t")

    def _read_delimited(self, delimiter: str) -> Iterator[Record]:
        with self._open() as f:
            reader = csv.reader(f, delimiter=delimiter)
            start = 1
            try:
                header = next(reader, None)
                if not header or all(not cell.strip() for cell in header):
                    raise DataError(self.path, 1, "missing header row")
                header = [cell.strip() for cell in header]
                start = reader.line_num + 1
                for row in reader:
                    lineno, start = start, reader.line_num + 1
                    if not row or all(not cell.strip() for cell in row):
                        self.empty_lines += 1
                        continue
                    if len(row) != len(header):
                        raise DataError(self.path, lineno, f"expected {len(header)} fields, got {len(row)}")
                    yield Record(lineno, {k: _maybe_list(v) for k, v in zip(header, row, strict=True)})
            except csv.Error as err:
                raise DataError(self.path, start, f"malformed {self.fmt.upper()} ({err})") from None
            except UnicodeDecodeError as err:
                raise DataError(self.path, start, f"not valid UTF-8 ({err.reason})") from None

    def _read_parquet(self) -> Iterator[Record]:
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

    def _read_conll(self) -> Iterator[Record]:
        tokens: list[str] = []
        tags: list[str] = []
        start = 0
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                line = self._decode(raw, lineno).rstrip("\r\n")
                if not line.strip():
                    if tokens:
                        yield self._conll_record(start, tokens, tags)
                        tokens, tags = [], []
                    else:
                        self.empty_lines += 1
                    continue
                cols = line.split("\t") if "\t" in line else line.split()
                if cols[0] == "-DOCSTART-":
                    continue
                if not tokens:
                    start = lineno
                if len(cols) > 1 and (tags or not tokens):
                    tags.append(cols[-1])
                elif len(cols) > 1 or tags:
                    raise DataError(self.path, lineno, "every token line of a sentence needs the same columns")
                tokens.append(cols[0])
        if tokens:
            yield self._conll_record(start, tokens, tags)

    def _conll_record(self, line: int, tokens: list[str], tags: list[str]) -> Record:
        data: dict[str, Any] = {self.tokens_key: tokens}
        if tags:
            data[self.tags_key] = tags
        return Record(line, data)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _maybe_list(value: str) -> Any:
    """CSV cells holding JSON lists (tokens, tags) become lists; anything else stays a string."""
    stripped = value.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        try:
            parsed = json.loads(stripped)
        except json.JSONDecodeError:
            return value
        return parsed if isinstance(parsed, list) else value
    return value


def read_hub(hub_id: str, hub_config: str | None, split: str) -> Iterator[Record]:
    """Rows of a Hugging Face dataset split; ClassLabel ids become their names."""
    import datasets  # heavy: imported only when a hub dataset is used

    ds = datasets.load_dataset(hub_id, hub_config, split=split)
    names = {}
    for column, feature in ds.features.items():
        inner = getattr(feature, "feature", feature)
        if isinstance(inner, datasets.ClassLabel):
            names[column] = inner.names

    def name(labels: list[str], v: Any) -> Any:
        # -1 marks "no label" (e.g. GLUE test splits): it must not wrap around to the last class name.
        return labels[v] if isinstance(v, int) and 0 <= v < len(labels) else None

    for row, data in enumerate(ds, 1):
        for column, labels in names.items():
            value = data[column]
            data[column] = [name(labels, v) for v in value] if isinstance(value, list) else name(labels, value)
        yield Record(row, data)
