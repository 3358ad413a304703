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
from pathlib import Path
from time import perf_counter
from typing import Any

import torch
from tqdm import tqdm

from mtl_decoder.data.inputs import PREDICTIONS, BadRecord, InputReader, InputRecord, check_text, check_tokens
from mtl_decoder.errors import UserError
from mtl_decoder.files import AtomicFile, remove
from mtl_decoder.inference import InferenceOptions, Predictor
from mtl_decoder.inference.options import BATCH_SIZE, PRECISION
from mtl_decoder.prediction.common import PredictSummary, resolve_options, set_aside
from mtl_decoder.prediction.outputs import is_errors_file, prediction_dict
from mtl_decoder.prediction.setup import file_job, prepare_file_run, prepare_model
from mtl_decoder.processes import launched
from mtl_decoder.saved import SavedModel
from mtl_decoder.termination import terminate_unwinds

# ---------------------------------------------------------------------------------------------- in programs


def predict_texts(
    model: SavedModel | str | Path,
    items: Iterable[str | Sequence[str]],
    tasks: str | Sequence[str] | None = None,
    batch_size: int = BATCH_SIZE,
    device: str | torch.device | None = None,
    precision: str = PRECISION,
    workers: int | None = None,
    gate_table: str | Path | None = None,
    cache_states: bool = False,
    cache_dir: str | Path | None = None,
    max_tokens: int | None = None,
    engine: str = "torch",
    pack_tokens: int | None = None,
    refine: bool = True,
    *,
    options: InferenceOptions | None = None,
) -> Iterator[dict[str, Any]]:
    """Predict raw texts or token lists.

    For each raw text or token list, in order: task name -> prediction (as in the output files). The model
    and the tasks are checked at once; a bad item (empty, not text, tokens not strings) raises UserError naming
    its index when the stream reaches it. The settings (mtl_decoder.inference.InferenceOptions, given as
    ``options`` or as keywords): ``precision`` fp32, bf16 or fp16 (GPUs); ``workers``: threads running batches side
    by side (see mtl_decoder.inference.Predictor); ``gate_table``: a table from build-gate-table
    (mtl_decoder.inference.gate_table; a SavedModel given here keeps using it). A frozen trunk's states are read
    from its cache folder under ``cache_dir`` (default: the model's) and written there only with ``cache_states``.
    ``max_tokens``: a batch's padded sub-words at most (None: the model's default, Predictor.default_max_tokens;
    0: rows only). int8 quantises a SavedModel given here in place. ``engine``: torch, or onnx (the folder's graph
    from export --format onnx, on ONNX Runtime). ``pack_tokens``: a pretrained trunk's texts packed into rows of at
    most this many ids (None: packing.PACK_TOKENS; 0: padded batches). ``refine``: int8 with a folder's W8A8 scales
    predicts the texts whose int8 label is close to a tie again in float32 (inference/refine.py; False: int8 alone)."""
    given = dict(batch_size=batch_size, device=device, precision=precision, workers=workers, gate_table=gate_table,
                 cache_states=cache_states, cache_dir=cache_dir, max_tokens=max_tokens, engine=engine,
                 pack_tokens=pack_tokens, refine=refine)  # fmt: skip
    options = resolve_options(options, given).checked()
    prepared = prepare_model(model, options, tasks)
    return _predict_items(prepared.predictor, items, prepared.tasks)


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
    batch_size: int = BATCH_SIZE,
    on_error: str = "fail",
    force: bool = False,
    progress: bool | None = None,
    device: str | torch.device | None = None,
    precision: str = PRECISION,
    workers: int | None = None,
    gate_table: str | Path | None = None,
    shard: str | tuple[int, int] | None = None,
    cache_states: bool = False,
    cache_dir: str | Path | None = None,
    max_tokens: int | None = None,
    engine: str = "torch",
    pack_tokens: int | None = None,
    refine: bool = True,
    options: InferenceOptions | None = None,
) -> PredictSummary:
    """Predict on every record of ``input`` and write OUT (JSON lines, input order); see the module doc.
    ``progress``: a progress bar on stderr (None: only when stderr is a terminal); the inference settings as in
    predict_texts (``options`` or keywords; their errors name the command's flags). The settings, the input, the
    output's folder and the model are checked before anything is predicted, the settings before the model loads.
    Called from the main thread, SIGTERM raises ``mtl_decoder.termination.Terminated`` (the previous handler is back
    when this returns).

    Under a launcher (torchrun, accelerate launch) the processes share the work and the main one writes the same
    files one process would; ``shard`` ('K/N') predicts only shard K of N into a part file for merge-predictions
    (see mtl_decoder.prediction.sharded)."""
    given = dict(batch_size=batch_size, device=device, precision=precision, workers=workers, gate_table=gate_table,
                 cache_states=cache_states, cache_dir=cache_dir, max_tokens=max_tokens, engine=engine,
                 pack_tokens=pack_tokens, refine=refine)  # fmt: skip
    options = resolve_options(options, given)
    fields = dict(tasks=tasks, fmt=fmt, text_column=text_column, on_error=on_error, force=force)
    if shard is not None or launched():
        from mtl_decoder.prediction.sharded import predict_file_sharded

        return predict_file_sharded(model, input, output, options, shard=shard, progress=progress, **fields)
    with terminate_unwinds() as unwinder:
        job = file_job(input, output, None, **fields)
        run = prepare_file_run(job, model, options.checked(flags=True))
        predictor, summary, skip, errors = run.prepared.predictor, run.summary, job.skip, job.errors
        show = sys.stderr.isatty() if progress is None else progress
        with AtomicFile(job.output, force) as out, AtomicFile(errors, force) if skip else nullcontext() as bad:
            _stream(predictor, run.reader, run.prepared.tasks, out, bad, summary, show)
            summary.empty_lines = run.reader.empty_lines
            with unwinder.deferred():  # the files of this run go into place together
                if bad is not None:
                    bad.commit()
                out.commit()
                if not skip and is_errors_file(errors):  # an earlier skip run's (force): it described another output
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
                set_aside(record, reader.path, bad)
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
