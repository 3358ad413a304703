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
        return open(self.path, encoding="utf-8", newline="")

    def _read_jsonl(self) -> Iterator[Record]:
        with self._open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    self.empty_lines += 1
                    continue
                yield Record(lineno, self._parse_object(line, lineno))

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
        text = Path(self.path).read_text(encoding="utf-8")
        decoder = json.JSONDecoder()
        pos = _skip_space(text, 0)
        if pos >= len(text) or text[pos] != "[":
            raise DataError(self.path, 1, "expected a JSON array of objects")
        pos = _skip_space(text, pos + 1)
        while pos < len(text) and text[pos] != "]":
            lineno = text.count("\n", 0, pos) + 1
            try:
                data, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as err:
                raise DataError(self.path, err.lineno, f"malformed JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(data, dict):
                raise DataError(self.path, lineno, f"expected a JSON object, got {type(data).__name__}")
            yield Record(lineno, data)
            pos = _skip_space(text, pos)
            if pos < len(text) and text[pos] == ",":
                pos = _skip_space(text, pos + 1)
        if pos >= len(text):
            raise DataError(self.path, text.count("\n") + 1, "malformed JSON (unterminated array)")

    def _read_csv(self) -> Iterator[Record]:
        yield from self._read_delimited(",")

    def _read_tsv(self) -> Iterator[Record]:
        yield from self._read_delimited("\t")

    def _read_delimited(self, delimiter: str) -> Iterator[Record]:
        with self._open() as f:
            reader = csv.reader(f, delimiter=delimiter)
            header = next(reader, None)
            if not header:
                raise DataError(self.path, 1, "missing header row")
            start = reader.line_num + 1
            for row in reader:
                lineno, start = start, reader.line_num + 1
                if not row or all(not cell.strip() for cell in row):
                    self.empty_lines += 1
                    continue
                if len(row) != len(header):
                    raise DataError(self.path, lineno, f"expected {len(header)} fields, got {len(row)}")
                yield Record(lineno, {k: _maybe_list(v) for k, v in zip(header, row, strict=True)})

    def _read_parquet(self) -> Iterator[Record]:
        import pyarrow.parquet as pq  # installed with datasets; imported here to keep start-up light

        row = 0
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=1024):
            for data in batch.to_pylist():
                row += 1
                yield Record(row, data)

    def _read_conll(self) -> Iterator[Record]:
        tokens: list[str] = []
        tags: list[str] = []
        start = 0
        with self._open() as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
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
    for row, data in enumerate(ds, 1):
        for column, labels in names.items():
            value = data[column]
            data[column] = [labels[v] for v in value] if isinstance(value, list) else labels[value]
        yield Record(row, data)
