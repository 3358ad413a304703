"""Tasks' data: read each split's sources into examples that carry one label set per task.

Tasks that read the same file (the SemEval file holds aspect tags and sentence polarity) share one
source: each of its records becomes ONE example with several label sets, not one copy per task.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from mtl_decoder.config import CLASSIFICATION, TAGGING, TaskConfig
from mtl_decoder.data import iob
from mtl_decoder.data.formats import Record, RecordReader
from mtl_decoder.data.hub import read_hub
from mtl_decoder.errors import DataError, UserError


@dataclass
class Example:
    words: list[str] | None
    """Pre-tokenised input (a list of words), or None for raw text."""
    text: str | None
    """Raw text input, or None for pre-tokenised input."""
    labels: dict[str, Any]
    """Task name -> tags (one per word) or class label."""
    line: int = 0
    """Line of the record in its source file."""
    word_lines: list[int] | None = None
    """CoNLL: the line of each word."""
    columns: dict[str, str] | None = None
    """CoNLL: field -> the column it was read from (``field_name``)."""


@dataclass
class Source:
    """One file (or hub split) and the tasks that read it."""

    key: str
    tasks: list[TaskConfig]
    examples: list[Example] = field(default_factory=list)
    empty_lines: int = 0
    repaired_tags: int = 0
    spellings: dict[str, dict[Any, tuple[str, int]]] = field(default_factory=dict)
    """Task -> class -> (the first spelling of its label, its line): a class is written one way in a file."""

    @property
    def sampling_weight(self) -> float:
        """How much training batches draw on this file (its tasks' ``sampling_weight``, which they share)."""
        return self.tasks[0].sampling_weight


def source_key(task: TaskConfig, split: str) -> str | None:
    where = getattr(task.data, split)
    if where is None:
        return None
    if task.data.hub_id:
        return f"hub:{task.data.hub_id}:{task.data.hub_config or ''}:{where}"
    return str(Path(where))


def split_sources(tasks: dict[str, TaskConfig], split: str, names: list[str] | None = None) -> list[Source]:
    """Group the tasks by the file they read for ``split``; a task without that split is an error."""
    sources: dict[str, Source] = {}
    for name in names or list(tasks):
        task = tasks[name]
        key = source_key(task, split)
        if key is None:
            raise UserError(f"task '{name}' has no '{split}' data (set tasks.{name}.data.{split})")
        sources.setdefault(key, Source(key, [])).tasks.append(task)
    for source in sources.values():
        _check_shared_columns(source)
        _check_shared_weight(source, split)
    return list(sources.values())


def _check_shared_columns(source: Source) -> None:
    """Tagging tasks sharing a file must read the same words; classification tasks there read those words too."""
    columns = {t.columns.tokens for t in source.tasks if t.kind == TAGGING}
    if len(columns) > 1:
        names = ", ".join(t.name for t in source.tasks)
        raise UserError(f"tasks {names} read {source.key} with different token columns {sorted(columns)}")


def _check_shared_weight(source: Source, split: str) -> None:
    """A file is drawn as one source: the tasks reading it must agree on its sampling weight (training only)."""
    weights = {t.sampling_weight for t in source.tasks}
    if split == "train" and len(weights) > 1:
        given = ", ".join(f"tasks.{t.name}.sampling_weight={t.sampling_weight:g}" for t in source.tasks)
        raise UserError(f"tasks reading {source.key} give it different sampling weights ({given}): set them equal")


def iter_records(source: Source) -> Iterator[tuple[str, Record]]:
    """(file name for errors, record) pairs; counts empty lines on the source."""
    task = source.tasks[0]
    if task.data.hub_id:
        split = source.key.rsplit(":", 1)[1]
        name = f"{task.data.hub_id}[{split}]"
        for record in read_hub(task.data.hub_id, task.data.hub_config, split):
            yield name, record
        return
    tagging = next((t for t in source.tasks if t.kind == TAGGING), task)
    reader = RecordReader(source.key, tokens_key=tagging.columns.tokens, tags_key=tagging.columns.tags)
    for record in reader:
        yield source.key, record
    source.empty_lines += reader.empty_lines


def read_source(source: Source, repair_iob: bool = False) -> Iterator[Example]:
    """Stream one source's records as validated examples (labels not yet checked against label sets)."""
    for path, record in iter_records(source):
        yield parse_example(source, path, record, repair_iob)


def parse_example(source: Source, path: str, record: Record, repair_iob: bool) -> Example:
    words, text = _read_input(source.tasks, record, path)
    labels: dict[str, Any] = {}
    for task in source.tasks:
        if task.kind == TAGGING:
            labels[task.name] = _checked_tags(source, task, record, words, path, repair_iob)
        else:
            labels[task.name] = _read_label(task, record.data, path, record.line)
            _check_spelling(source, task, record.data[task.columns.label], labels[task.name], path, record.line)
    return Example(words, text, labels, record.line, record.word_lines, record.columns)


def field_name(columns: dict[str, str] | None, key: str) -> str:
    """How an error names a field: the column it was read from in a .conll file, else its name."""
    return (columns or {}).get(key, key)


def _word_line(record: Record, index: int) -> int:
    return record.word_lines[index] if record.word_lines else record.line


def _checked_tags(
    source: Source, task: TaskConfig, record: Record, words: list[str], path: str, repair_iob: bool
) -> list[str]:
    """A tagging task's tags of one record, valid IOB2 (repaired when ``repair_iob``, the repairs counted)."""
    tags = _read_tags(task, record, words, path)
    column = field_name(record.columns, task.columns.tags)
    bad = iob.first_invalid(tags)
    if bad is not None and not iob.is_tag(tags[bad]):
        raise DataError(path, _word_line(record, bad), _not_a_tag(tags[bad], bad), column)
    if bad is not None:
        if not repair_iob:
            raise DataError(
                path,
                _word_line(record, bad),
                f"invalid IOB2 tag '{tags[bad]}' at word {bad + 1} (no B-/I- of "
                "the same type before it; set data.repair_iob=true to repair)",
                column,
            )
        tags, changed = iob.repair(tags)
        source.repaired_tags += changed
    return tags


def _not_a_tag(tag: str, index: int) -> str:
    cleaned = tag.strip()
    if cleaned.startswith(("B-", "I-")):
        cleaned = cleaned[:2] + cleaned[2:].strip()
    if cleaned != tag and iob.is_tag(cleaned):  # "B-PER " would be a type of its own, unlike "B-PER"
        return f"tag {tag!r} at word {index + 1} has white space around it (write {cleaned!r})"
    return f"tag '{tag}' at word {index + 1} is not O, B-X or I-X (IOB2)"


def _read_input(tasks: list[TaskConfig], record: Record, path: str) -> tuple[list | None, str | None]:
    data, line = record.data, record.line
    tagging = next((t for t in tasks if t.kind == TAGGING), None)
    task = tagging or tasks[0]
    tokens_col, text_col = task.columns.tokens, task.columns.text
    if tagging is None and text_col in data:
        text = data[text_col]
        if not isinstance(text, str):
            raise DataError(path, line, f"expected a string, got {type(text).__name__}", text_col)
        if not text.strip():
            raise DataError(path, line, "empty text", text_col)
        return None, text
    if tokens_col not in data:
        wanted = tokens_col if tagging else f"{text_col}' or '{tokens_col}"
        raise DataError(path, line, f"missing column '{wanted}' (columns: {', '.join(map(str, data))})")
    words = data[tokens_col]
    if isinstance(words, str) and record.text_cells:  # a CSV/TSV cell: space-separated words
        words = words.split()
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        got = f", got the string {_short(words)}" if isinstance(words, str) else ""
        raise DataError(path, line, f"expected a list of strings{got}", tokens_col)
    if not words:
        raise DataError(path, line, "empty token list", tokens_col)
    if any(not w or w.isspace() for w in words):
        raise DataError(path, line, "a token is empty or whitespace", tokens_col)
    return words, None


def _short(value: str, limit: int = 40) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _read_tags(task: TaskConfig, record: Record, words: list[str], path: str) -> list[str]:
    data, line, col = record.data, record.line, task.columns.tags
    if col not in data:
        if record.columns is not None:  # a .conll file: a token line holds only the word
            raise DataError(path, line, "no tag column: each token line needs the word, then its tag")
        raise DataError(path, line, f"missing column '{col}' (columns: {', '.join(map(str, data))})")
    tags = data[col]
    if isinstance(tags, str) and record.text_cells:  # a CSV/TSV cell: space-separated tags
        tags = tags.split()
    if not isinstance(tags, list):
        got = f", got the string {_short(tags)}" if isinstance(tags, str) else ""
        raise DataError(path, line, f"expected a list of tags{got}", col)
    if task.labels is not None and tags and all(isinstance(t, int) and not isinstance(t, bool) for t in tags):
        if any(not 0 <= t < len(task.labels) for t in tags):
            raise DataError(path, line, f"tag id out of range for {len(task.labels)} labels", col)
        tags = [task.labels[t] for t in tags]
    if not all(isinstance(t, str) for t in tags):
        raise DataError(path, line, "expected string tags (or ids with a labels list in the task file)", col)
    if len(tags) != len(words):
        raise DataError(path, line, f"{len(words)} tokens but {len(tags)} tags", field_name(record.columns, col))
    return tags


def _read_label(task: TaskConfig, data: dict[str, Any], path: str, line: int) -> str:
    col = task.columns.label
    if col not in data:
        raise DataError(path, line, f"missing column '{col}' (columns: {', '.join(map(str, data))})")
    value = data[col]
    if isinstance(value, float):  # JSON 1.0 or NaN: a measurement, not a class; 1.0 beside 1 would be two classes
        shown = "NaN" if math.isnan(value) else repr(value)
        raise DataError(path, line, f"expected a class label (a string or an integer), got the number {shown}", col)
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise DataError(path, line, f"expected a class label, got {value!r}", col)
    if isinstance(value, str) and _number(value) is NAN:
        raise DataError(path, line, f"expected a class label, got '{value}' (a missing value?)", col)
    if isinstance(value, str) and value.strip().isdigit() and task.labels is not None and value not in task.labels:
        value = int(value)  # a class id read from CSV/TSV, where every cell is a string
    if isinstance(value, int) and task.labels is not None and str(value) not in task.labels:
        if not 0 <= value < len(task.labels):
            raise DataError(path, line, f"label id {value} out of range for {len(task.labels)} labels", col)
        return task.labels[value]
    value = str(value).strip()
    if not value:
        raise DataError(path, line, "empty label", col)
    return value


NAN = object()
"""What ``_number`` returns for a spelling of NaN."""


def _number(text: str) -> Any:
    """The number a label spells ('1', '1.0', '01', '1e0' -> Decimal 1; 'nan' -> NAN), or None for a name."""
    try:
        number = Decimal(text.strip())
    except InvalidOperation:
        return None
    if number.is_nan():
        return NAN
    return None if number.is_infinite() else number


def _check_spelling(source: Source, task: TaskConfig, raw: Any, label: str, path: str, line: int) -> None:
    """Check that a file spells each class one way.

    One spelling per class in a file: '1' beside '1.0', or an id beside its class name, is an error naming
    both lines (read as written they would be two classes, or the file mixes two conventions)."""
    spelling = str(raw).strip()
    number = _number(label) if label == spelling else None
    key = number if number is not None else label
    first = source.spellings.setdefault(task.name, {}).setdefault(key, (spelling, line))
    if first[0] != spelling:
        raise DataError(
            path,
            line,
            f"label '{spelling}' and label '{first[0]}' (line {first[1]}) spell one class two ways; write each "
            "class one way",
            task.columns.label,
        )


# ------------------------------------------------------------------------------------------------ label sets


def infer_labels(task: TaskConfig, examples: list[Example]) -> list[str]:
    """The task's label set: listed in the task file, or everything seen in train (tags: B-X and I-X per type)."""
    seen = {ex.labels[task.name] for ex in examples if task.name in ex.labels and task.kind == CLASSIFICATION}
    if task.kind == TAGGING:
        tags = {t for ex in examples if task.name in ex.labels for t in ex.labels[task.name]}
        types = {t[2:] for t in tags if t != "O"}
        seen = tags | {"O"} | {f"{p}-{k}" for k in types for p in "BI"}
        return iob.sort_tag_labels(seen) if task.labels is None else list(task.labels)
    return sorted(seen) if task.labels is None else list(task.labels)


def check_labels(source: Source, label_sets: dict[str, list[str]], split: str) -> None:
    """Every label in ``source`` must be in its task's (train) label set: names file, line and field."""
    for task in source.tasks:
        allowed = set(label_sets[task.name])
        for ex in source.examples:
            value = ex.labels[task.name]
            values = value if isinstance(value, list) else [value]
            for i, v in enumerate(values):
                if v not in allowed:
                    column = task.columns.tags if task.kind == TAGGING else task.columns.label
                    where = "the train label set" if split != "train" else "the task's labels list"
                    tagged = isinstance(value, list) and ex.word_lines
                    raise DataError(
                        _source_name(source),
                        ex.word_lines[i] if tagged else ex.line,
                        f"label '{v}' is not in {where} ({', '.join(sorted(allowed))})",
                        field_name(ex.columns, column),
                    )


def _source_name(source: Source) -> str:
    return source.key.split(":", 1)[1] if source.key.startswith("hub:") else source.key


def load_split(
    tasks: dict[str, TaskConfig], split: str, names: list[str] | None = None, repair_iob: bool = False
) -> list[Source]:
    """Read every source of a split into memory (validated, not yet encoded)."""
    sources = split_sources(tasks, split, names)
    for source in sources:
        source.examples = list(read_source(source, repair_iob))
        if not source.examples:
            raise UserError(f"{_source_name(source)}: no examples for the {split} split")
    return sources
