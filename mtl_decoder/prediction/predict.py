"""Batch prediction on files and on texts in a program.

``predict_file`` streams an input file (see ``inputs``) through the model's ``Predictor`` (a bounded buffer,
length-sorted batches, input order kept) and writes one JSON line per record: its own fields plus
``predictions`` (see ``outputs``; a record with its own ``predictions`` field is a bad record, never
overwritten). A record that cannot be read stops the run (``on_error='fail'``: a DataError naming file:line,
and no output file is left) or goes to OUT.errors.jsonl with its line, reason and raw text
(``on_error='skip'``); either way ``read == predicted + skipped``. A skip run in which every record failed still
writes both files, and its summary says ``all_failed`` (the CLI then exits with status 2).

Nothing is left half-written: both files are written under temporary names (``mtl_decoder.files``) and renamed
on success; SIGTERM during the run raises ``Terminated`` (the temporaries are discarded, the CLI exits with
143), and a run removes the temporaries of OUT and OUT.errors.jsonl that a killed run (SIGKILL) left. With
``force``, a fail-mode run also removes an OUT.errors.jsonl of an earlier skip run once the new output is in
place; without ``force`` an existing one is refused in either mode.

``predict_texts`` yields the same prediction dicts for an iterable of raw texts or token lists.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

import torch
from tqdm import tqdm

from mtl_decoder.config import parse_task_names
from mtl_decoder.errors import DataError, UserError
from mtl_decoder.files import AtomicFile, remove, stale_temporaries, terminate_unwinds
from mtl_decoder.inference import Predictor
from mtl_decoder.prediction.inputs import BadRecord, InputReader, InputRecord, check_text, check_tokens
from mtl_decoder.prediction.outputs import PREDICTIONS, check_targets, errors_path, prediction_dict
from mtl_decoder.processes import launched
from mtl_decoder.saved import SavedModel, load_model

ON_ERROR = ("fail", "skip")


@dataclass
class PredictSummary:
    """What a ``predict_file`` run did: every non-empty record read is either predicted or skipped."""

    input: str
    output: str
    errors: str | None
    """The skipped-records file (skip mode), else None."""
    read: int = 0
    predicted: int = 0
    skipped: int = 0
    truncated: int = 0
    """Records longer than the model's maximum length whose classification saw only the first window."""
    windowed: int = 0
    """Records tagged in more than one window (too long for one pass)."""
    untagged_words: int = 0
    """Words longer than the maximum length on their own: in no window whole, so left 'O' unread."""
    empty_lines: int = 0
    tokens: int = 0
    """Words predicted on: the input tokens, or the pre-tokenizer's words of a raw text."""
    seconds: float = 0.0
    precision: str = "fp32"
    """The model's inference precision (see mtl_decoder.inference.PRECISIONS)."""
    states: dict[str, int] | None = None
    """A frozen trunk's state cache: texts 'computed' by the trunk, found 'cached' (computed before this run),
    and 'repeated' inside the input (computed earlier in this run); None for other models."""
    removed: list[str] = field(default_factory=list)
    """Files removed on the way: temporaries of a killed run, an earlier run's errors file (fail mode, force)."""

    @property
    def all_failed(self) -> bool:
        """Records were read and none could be predicted (skip mode: every one went to the errors file)."""
        return self.read > 0 and self.predicted == 0

    @property
    def records_per_s(self) -> float:
        return self.predicted / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "records_per_s": self.records_per_s, "tokens_per_s": self.tokens_per_s}

    def report(self) -> str:
        lines = [
            f"read {self.read:,} records: predicted {self.predicted:,}, skipped {self.skipped:,}, "
            f"truncated {self.truncated:,}, tagged in windows {self.windowed:,}; "
            f"empty lines skipped {self.empty_lines:,}",
            f"{self.seconds:.1f} s ({self.precision}): {self.records_per_s:,.1f} records/s, "
            f"{self.tokens_per_s:,.0f} words/s",
            f"predictions -> {self.output}",
        ]
        if self.states is not None:
            s = self.states
            lines.insert(
                1,
                f"trunk states: {s['computed']:,} texts computed, {s['cached']:,} from the state cache, "
                f"{s['repeated']:,} repeats inside the input (the windows of a long text count apiece)",
            )
        if self.errors is not None:
            lines.append(f"skipped records ({self.skipped:,}) -> {self.errors}")
        if self.removed:
            lines.append(f"removed: {', '.join(self.removed)}")
        if self.read == 0:
            lines.append(f"warning: {self.input} holds no records")
        if self.truncated:
            lines.append(
                f"warning: {self.truncated:,} records were longer than the model's maximum length; their "
                'classification read only the beginning (marked "truncated": true)'
            )
        if self.untagged_words:
            lines.append(
                f"warning: {self.untagged_words:,} words were longer than the model's maximum length on their own: "
                'they are tagged "O" without being read (counted per record as "untagged")'
            )
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- in programs


def predict_texts(
    model: SavedModel | str | Path,
    items: Iterable[str | Sequence[str]],
    tasks: str | Sequence[str] | None = None,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    precision: str = "fp32",
    workers: int | None = None,
    gate_table: str | Path | None = None,
    cache_states: bool = False,
    cache_dir: str | Path | None = None,
) -> Iterator[dict[str, Any]]:
    """For each raw text or token list, in order: task name -> prediction (as in the output files). The model
    and the tasks are checked at once; a bad item (empty, not text, tokens not strings) raises UserError naming
    its index when the stream reaches it. ``precision``: fp32, bf16 or fp16 (GPUs); ``workers``: threads running
    batches side by side (see mtl_decoder.inference.Predictor); ``gate_table``: a table from build-gate-table
    (mtl_decoder.inference.gate_table; a SavedModel given here keeps using it). A frozen trunk's states are read
    from its cache folder under ``cache_dir`` (default: the model's) and written there only with ``cache_states``.
    int8 quantises a SavedModel given here in place."""
    saved = _with_gate_table(_load(model, device), gate_table)
    names = resolve_tasks(saved, tasks)
    predictor = Predictor.from_saved(
        saved, _check_batch_size(batch_size), precision, workers, cache_states=cache_states, cache_dir=cache_dir
    )
    return _predict_items(predictor, items, names)


def _predict_items(predictor: Predictor, items: Iterable[str | Sequence[str]], tasks: list[str]) -> Iterator[dict]:
    pending: deque[str | list[str]] = deque()

    def checked() -> Iterator[str | list[str]]:
        for index, item in enumerate(items):
            item = list(item) if isinstance(item, tuple) else item
            reason = _item_problem(item)
            if reason:
                raise UserError(f"item {index}: {reason}")
            pending.append(item)
            yield item

    for pred in predictor.predict(checked(), tasks):
        yield prediction_dict(pred, pending.popleft(), tasks, predictor.kinds)


def _item_problem(item: Any) -> str | None:
    if isinstance(item, str):
        reason = check_text(item)
        return f"text {reason}" if reason else None
    if isinstance(item, list):
        return check_tokens(item)
    return f"must be a text or a list of tokens, got {type(item).__name__}"


# ---------------------------------------------------------------------------------------------- on files


def predict_file(
    model: SavedModel | str | Path,
    input: str | Path,
    output: str | Path,
    *,
    tasks: str | Sequence[str] | None = None,
    fmt: str | None = None,
    text_column: str = "text",
    batch_size: int = 64,
    on_error: str = "fail",
    force: bool = False,
    progress: bool | None = None,
    device: str | torch.device | None = None,
    precision: str = "fp32",
    workers: int | None = None,
    gate_table: str | Path | None = None,
    shard: str | tuple[int, int] | None = None,
    cache_states: bool = False,
    cache_dir: str | Path | None = None,
) -> PredictSummary:
    """Predict on every record of ``input`` and write OUT (JSON lines, input order); see the module doc.
    ``progress``: a progress bar on stderr (None: only when stderr is a terminal); ``precision``, ``workers``,
    ``gate_table``, ``cache_states`` and ``cache_dir`` as in predict_texts. The input, the output's folder and the
    model are checked before anything is predicted. Called from the main thread, SIGTERM raises
    ``mtl_decoder.files.Terminated`` (the previous handler is back when this returns).

    Under a launcher (torchrun, accelerate launch) the processes share the work and the main one writes the same
    files one process would; ``shard`` ('K/N') predicts only shard K of N into a part file for merge-predictions
    (see mtl_decoder.prediction.sharded)."""
    if shard is not None or launched():
        from mtl_decoder.prediction.sharded import predict_file_sharded

        return predict_file_sharded(
            model, input, output, shard=shard, tasks=tasks, fmt=fmt, text_column=text_column, batch_size=batch_size,
            on_error=on_error, force=force, progress=progress, device=device, precision=precision, workers=workers,
            gate_table=gate_table, cache_states=cache_states, cache_dir=cache_dir,
        )  # fmt: skip
    with terminate_unwinds() as unwinder:
        if on_error not in ON_ERROR:
            raise UserError(f"on_error must be one of {', '.join(ON_ERROR)}, got '{on_error}'")
        _check_batch_size(batch_size)
        reader = InputReader(input, fmt, text_column)
        output = Path(output)
        errors = errors_path(output)
        skip = on_error == "skip"
        check_targets(input, output, errors, skip, force, model)
        saved = _with_gate_table(_load(model, device), gate_table)
        names = resolve_tasks(saved, tasks)
        predictor = Predictor.from_saved(
            saved, batch_size, precision, workers, cache_states=cache_states, cache_dir=cache_dir
        )
        summary = PredictSummary(str(input), str(output), str(errors) if skip else None, precision=precision)
        for stale in stale_temporaries(output) + stale_temporaries(errors):  # left by a killed run
            remove(stale)
            summary.removed.append(str(stale))
        show = sys.stderr.isatty() if progress is None else progress
        with AtomicFile(output, force) as out, AtomicFile(errors, force) if skip else nullcontext() as bad:
            _stream(predictor, reader, names, out, bad, summary, show)
            summary.empty_lines = reader.empty_lines
            with unwinder.deferred():  # the files of this run go into place together
                if bad is not None:
                    bad.commit()
                out.commit()
                if not skip and errors.exists():  # an earlier skip run's (force): it described another output
                    remove(errors)
                    summary.removed.append(str(errors))
        return summary


def _stream(
    predictor: Predictor,
    reader: InputReader,
    tasks: list[str],
    out: AtomicFile,
    bad: AtomicFile | None,
    summary: PredictSummary,
    progress: bool,
) -> None:
    """Read, predict and write every record, in order; the pending queue is as long as the Predictor's buffer."""
    pending: deque[InputRecord] = deque()

    def items() -> Iterator[str | list[str]]:
        for record in reader:
            summary.read += 1
            if isinstance(record, BadRecord):
                _set_aside(record, reader.path, bad)
                summary.skipped += 1
                continue
            pending.append(record)
            yield record.item

    start = perf_counter()
    cache = predictor.state_cache
    before = (cache.hits, cache.repeats, cache.misses) if cache is not None else None
    bar = tqdm(desc="predict", unit=" records", disable=not progress, delay=1.0, mininterval=0.5, file=sys.stderr)
    with bar:
        for pred in predictor.predict(items(), tasks):
            record = pending.popleft()
            out.write_json({**record.fields, PREDICTIONS: prediction_dict(pred, record.item, tasks, predictor.kinds)})
            summary.predicted += 1
            summary.tokens += len(pred.words)
            summary.truncated += pred.truncated
            summary.windowed += pred.windows > 1
            summary.untagged_words += pred.untagged
            bar.update()
    summary.seconds = perf_counter() - start
    if cache is not None:
        cache.flush()  # --cache-states: the last shard
        now = (cache.hits, cache.repeats, cache.misses)
        hits, repeats, misses = (a - b for a, b in zip(now, before, strict=True))
        summary.states = {"computed": misses, "cached": hits, "repeated": repeats}


def _set_aside(record: BadRecord, path: str, bad: AtomicFile | None) -> None:
    """Fail mode (no errors file): raise the record's DataError; skip mode: write it to the errors file."""
    if bad is None:
        raise DataError(path, record.line, record.reason, record.field)
    entry: dict[str, Any] = {"line": record.line, "reason": record.reason}
    if record.field is not None:
        entry["reason"] = f"field '{record.field}': {record.reason}"
        entry["field"] = record.field
    entry["raw"] = record.raw
    bad.write_json(entry)


# ---------------------------------------------------------------------------------------------- shared


def resolve_tasks(saved: SavedModel, tasks: str | Sequence[str] | None) -> list[str]:
    """The tasks to predict: all of the model's, or the given names (a list or a comma-separated string)."""
    known = saved.model.task_names
    return parse_task_names(tasks, known) or list(known)


def _load(model: SavedModel | str | Path, device: str | torch.device | None) -> SavedModel:
    if isinstance(model, SavedModel):
        return model
    return load_model(model, device)


def _with_gate_table(saved: SavedModel, gate_table: str | Path | None) -> SavedModel:
    """The model reading its gates from a gate table (opt-in; see mtl_decoder.inference.gate_table)."""
    if gate_table is not None:
        from mtl_decoder.inference.gate_apply import apply_gate_table

        apply_gate_table(saved, gate_table)
    return saved


def _check_batch_size(batch_size: int) -> int:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch size must be a positive integer, got {batch_size!r}")
    return batch_size
