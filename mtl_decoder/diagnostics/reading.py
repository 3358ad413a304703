"""Reading task data to count its problems rather than stop at the first one.

Training reads a split through ``mtl_decoder.data.tasks`` and raises a ``DataError`` at the first bad record.
``debug-data`` wants every problem counted, so here each record is parsed on its own: a record that cannot be
read (malformed JSON, a missing column, a tag that is not IOB2 at all) is set aside with its line and reason, and
an IOB2 violation that training would repair with ``data.repair_iob=true`` is counted and the record kept (with
its tags repaired), so the rest of the statistics still see it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mtl_decoder.config import SPLITS, TAGGING, TaskConfig
from mtl_decoder.data.formats import BadRecord, FileRecords, Record
from mtl_decoder.data.safejson import json_list_cell
from mtl_decoder.data.tasks import (
    Example,
    Source,
    field_name,
    iter_records,
    parse_example,
    source_key,
    split_sources,
)
from mtl_decoder.errors import DataError, UserError

MAX_CASES = 5
"""Cases (file:line and reason) kept per kind of problem and source."""


@dataclass
class Problem:
    """One record that could not be used, or was used only after repair."""

    line: int
    reason: str

    def at(self, path: str) -> str:
        return f"{path}:{self.line}: {self.reason}"


@dataclass
class SourceRead:
    """One source of one split, read to the end whatever it holds."""

    split: str
    source: Source
    """The file and its tasks; ``examples`` holds the records that parsed (IOB2 repaired where needed)."""
    bad_records: int = 0
    """Records no task could use (malformed, a missing column, an impossible tag, ...)."""
    bad_cases: list[Problem] = field(default_factory=list)
    invalid_iob: dict[str, int] = field(default_factory=dict)
    """Task -> records whose tags break IOB2 (an I-X with no B-X/I-X before it); repairable."""
    iob_cases: dict[str, list[Problem]] = field(default_factory=dict)
    error: str | None = None
    """Why the source as a whole could not be read (file not found, unknown format, ...), else None."""

    @property
    def path(self) -> str:
        """The source as shown to the user: relative to the working directory when inside it."""
        return display_path(self.source.key)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.source.tasks]


def read_all_splits(tasks: dict[str, TaskConfig]) -> tuple[dict[str, list[SourceRead]], list[tuple[str, str]]]:
    """Read every split every task names, counting problems.

    Every split every task names, read with counting. Returns split -> sources, and the (task, split) pairs the
    tasks leave unset."""
    reads: dict[str, list[SourceRead]] = {}
    missing = []
    for split in SPLITS:
        names = [n for n, t in tasks.items() if source_key(t, split) is not None]
        missing += [(n, split) for n in tasks if n not in names]
        reads[split] = [read_counting(source, split) for source in split_sources(tasks, split, names)] if names else []
    return reads, missing


def read_counting(source: Source, split: str) -> SourceRead:
    """Read one source to its end, counting problems.

    Read one source to its end; problems are counted on the result, never raised (a whole-file problem, such
    as a missing file, is kept in ``error``)."""
    read = SourceRead(split, source)
    try:
        for path, record in _records(source):
            if isinstance(record, BadRecord):
                _bad(read, Problem(record.line, record.reason))
                continue
            example = _parse(read, path, record)
            if example is not None:
                source.examples.append(example)
    except UserError as err:
        read.error = str(err)
    return read


def _records(source: Source) -> Iterator[tuple[str, Record | BadRecord]]:
    """Like ``data.tasks.iter_records``, but a bad record is yielded, not raised (local files)."""
    task = source.tasks[0]
    if task.data.hub_id:
        yield from iter_records(source)
        return
    tagging = next((t for t in source.tasks if t.kind == TAGGING), task)
    records = FileRecords(source.key, tokens_key=tagging.columns.tokens, tags_key=tagging.columns.tags)
    delimited = records.fmt in ("csv", "tsv")
    for record in records:
        if delimited and isinstance(record, Record):
            record.data = {k: json_list_cell(v) for k, v in record.data.items()}
        yield source.key, record
    source.empty_lines += records.empty_lines


def _parse(read: SourceRead, path: str, record: Record) -> Example | None:
    """The record as training reads it; when only IOB2 repair would make it readable, counted and repaired."""
    try:
        return parse_example(read.source, path, record, repair_iob=False)
    except DataError as strict:
        try:
            example = parse_example(read.source, path, record, repair_iob=True)
        except DataError as err:
            _bad(read, Problem(err.line or record.line, _reason(err)))
            return None
        fields = {field_name(record.columns, t.columns.tags): t.name for t in read.source.tasks if t.kind == TAGGING}
        task = fields.get(strict.field or "", read.names[0])
        read.invalid_iob[task] = read.invalid_iob.get(task, 0) + 1
        cases = read.iob_cases.setdefault(task, [])
        if len(cases) < MAX_CASES:
            cases.append(Problem(strict.line or record.line, _reason(strict)))
        return example


def _bad(read: SourceRead, problem: Problem) -> None:
    read.bad_records += 1
    if len(read.bad_cases) < MAX_CASES:
        read.bad_cases.append(problem)


def _reason(err: DataError) -> str:
    return f"field '{err.field}': {err.reason}" if err.field else err.reason


def display_path(key: str) -> str:
    """A file path relative to the working directory when it lies inside it (shorter in reports), else as is."""
    path = Path(key)
    if not path.is_absolute():
        return key
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return key


def task_examples(reads: list[SourceRead], task: str) -> tuple[SourceRead | None, list[Example]]:
    """The source a task reads in a split, and its examples that carry the task's label."""
    for read in reads:
        if task in read.names:
            return read, [ex for ex in read.source.examples if task in ex.labels]
    return None, []


def example_text(example: Example) -> str:
    """The example's input as one string (words joined by spaces)."""
    return example.text if example.text is not None else " ".join(example.words or [])
