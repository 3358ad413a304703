"""``predict`` over several processes and as one shard of a job.

``predict`` over several processes (under ``torchrun`` / ``accelerate launch``) and as one shard of a job
(``--shard K/N``), with the output one process would write.

Every process reads the whole input stream (reading is cheap next to the model) and takes its share: blocks of
the Predictor's buffer (16 batches) of the records that can be read, dealt round-robin (``mtl_decoder.processes
.Share``), so each process forms exactly the batches one process would and the predictions are bit-identical.
Each process predicts its blocks on its own device and turns them into output lines; in rounds, the main process
gathers one block from every process (``gather_object`` over NCCL or gloo) and writes them in input order, so it
holds at most one block per process. Memory stays constant however long the input is.

Because every process reads every record, all of them meet a bad record at the same point: in fail mode all stop
with the error one process would give, and no output appears. Any other failure in a process reaches the others
at the next round, and every process stops, the main one naming the rank that failed; a process that is killed
is noticed as a lost connection (the launcher's summary names its rank). Only the main process writes (writer.py),
through temporary files renamed into place at the end: nothing is left half-written.

With ``--shard K/N`` the same dealing runs over N shards: shard K predicts the blocks b with b mod N == K (under
a launcher, split again between its processes) and writes a part file (``parts``) in which every record carries
its input index and line; ``merge-predictions`` puts the parts back together. A record that cannot be read goes
with the block the stream is in when it is met.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any, TypeVar

from tqdm import tqdm

from mtl_decoder.data.inputs import PREDICTIONS, BadRecord, InputReader, InputRecord
from mtl_decoder.errors import DataError, UserError
from mtl_decoder.inference import InferenceOptions, Predictor
from mtl_decoder.prediction.common import PredictSummary, set_aside
from mtl_decoder.prediction.outputs import prediction_dict
from mtl_decoder.prediction.parts import COUNTS, InputDigest, file_fingerprint, model_fingerprint
from mtl_decoder.prediction.setup import FileJob, FileRun, file_job, prepare_file_run
from mtl_decoder.prediction.writer import RunWriter
from mtl_decoder.processes import Processes, ProcessFailed, Share
from mtl_decoder.termination import terminate_unwinds

T = TypeVar("T")


@dataclass
class _Block:
    """A process's contribution to one round: output lines of one block (index, line, JSON) and their counts."""

    rows: list[tuple[int, int, str]] = field(default_factory=list)
    tokens: int = 0
    truncated: int = 0
    windowed: int = 0
    untagged: int = 0
    failure: tuple[int, str, str] | None = None
    """(rank, kind, message) when this process failed (see ``_failure``)."""


def predict_file_sharded(
    model: Any,
    input: str | Path,
    output: str | Path,
    options: InferenceOptions,
    *,
    shard: str | tuple[int, int] | None,
    progress: bool | None = None,
    **fields: Any,
) -> PredictSummary:
    """``predict_file`` over the launcher's processes and/or as one shard.

    ``predict_file`` over the launcher's processes and/or as shard K/N (see the module doc); ``fields``: the
    FileJob's (tasks, fmt, text_column, on_error, force). Every process returns the summary of the whole run (of
    the shard, with ``shard``), which the main process printed."""
    processes = Processes.join()
    with terminate_unwinds() as unwinder:

        def prepare() -> tuple[FileRun, Share, dict[str, Any]]:
            return _prepare(processes, model, file_job(input, output, shard, **fields), options)

        run, share, identity = _agree(processes, prepare)
        job, reader, predictor, summary = run.job, run.reader, run.prepared.predictor, run.summary
        show = processes.is_main and (sys.stderr.isatty() if progress is None else progress)
        bar = tqdm(desc="predict", unit=" rec", disable=not show, delay=1.0, mininterval=0.5, file=sys.stderr)
        writer = None
        try:
            if processes.is_main:
                with unwinder.deferred():  # a SIGTERM now waits until the writer exists, so its files are discarded
                    writer = RunWriter(job.output, job.errors, job.skip, job.shard is not None)
            names = run.prepared.tasks
            seen = _run(reader, predictor, names, share, processes, writer, summary, job.skip, bar)
            if predictor.state_cache is not None:
                predictor.state_cache.flush()  # --cache-states: each process writes its own last shard
            summary.empty_lines = reader.empty_lines
            if writer is not None:
                with unwinder.deferred():  # the files of this run go into place together
                    writer.commit(_footer(share, reader, seen, summary, job.on_error, names, identity), summary)
        finally:
            bar.close()
            if writer is not None:
                writer.discard()
        return processes.broadcast(summary)


def _prepare(
    processes: Processes, model: Any, job: FileJob, options: InferenceOptions
) -> tuple[FileRun, Share, dict[str, Any]]:
    """The shared set-up of a sharded prediction on every process.

    The shared set-up (``setup.prepare_file_run``) on every process, on the process's own device under a
    launcher (the targets checked on the main one, which alone writes); then its share of the blocks and what
    identifies the job's model for a part's footer (empty without a shard)."""
    options = options.checked(flags=True).on_device(processes.device)
    run = prepare_file_run(job, model, options, writes=processes.is_main)
    k, n = job.shard if job.shard is not None else (0, 1)
    share = Share(run.prepared.predictor.buffer, k, n, processes.rank, processes.world)
    identity = {}
    if job.shard is not None and processes.is_main:
        identity = {"model": model_fingerprint(run.prepared.saved), "gate_table": file_fingerprint(options.gate_table)}
    return run, share, identity


# ------------------------------------------------------------------------------------------------ the stream


@dataclass
class _Reading:
    """What reading the stream has found so far."""

    dealt: int = 0
    """Readable records (the ones dealt in blocks)."""
    records: int = 0
    """Every record, readable or not (the input indices)."""
    digest: InputDigest = field(default_factory=InputDigest)
    """A fingerprint of every record read, for a part's footer."""


def _own(
    reader: InputReader, share: Share, writer: RunWriter | None, summary: PredictSummary, seen: _Reading, skip: bool
) -> Iterator[tuple[int, InputRecord]]:
    """The readable records this process predicts.

    (input index, record) of the readable records this process predicts. A bad record stops the run in fail
    mode (every process meets it) and goes to the main process's errors file (or part) in skip mode."""
    for index, record in enumerate(reader):
        seen.records += 1
        seen.digest.add(record)
        mine = share.in_shard(seen.dealt)
        summary.read += mine
        if isinstance(record, BadRecord):
            if not skip:
                set_aside(record, reader.path, None)  # raises the record's DataError
            summary.skipped += mine
            if mine and writer is not None:
                writer.error(index, record, reader.path)
            continue
        if share.owns(seen.dealt):
            yield index, record
        seen.dealt += 1


def _lines(predictor: Predictor, own: Iterator[tuple[int, InputRecord]], tasks: list[str]) -> Iterator[tuple]:
    """(index, line, output JSON, words, truncated, windows, untagged words) of every record of ``own``, in order."""
    pending: deque[tuple[int, InputRecord]] = deque()

    def items() -> Iterator[str | list[str]]:
        for index, record in own:
            pending.append((index, record))
            yield record.item

    for pred in predictor.predict(items(), tasks):
        index, record = pending.popleft()
        fields = {**record.fields, PREDICTIONS: prediction_dict(pred, record.item, tasks, predictor.kinds)}
        text = json.dumps(fields, ensure_ascii=False)
        yield index, record.line, text, len(pred.words), pred.truncated, pred.windows, pred.untagged


def _run(
    reader: InputReader,
    predictor: Predictor,
    tasks: list[str],
    share: Share,
    processes: Processes,
    writer: RunWriter | None,
    summary: PredictSummary,
    skip: bool,
    bar: tqdm,
) -> _Reading:
    """Predict this process's blocks and hand them to the main process.

    Predict this process's blocks and hand them to the main process, one per round; the main process writes
    every round's blocks in input order. Returns what the reading found."""
    seen = _Reading()
    lines = _lines(predictor, _own(reader, share, writer, summary, seen, skip), tasks)
    start, rounds, block = perf_counter(), 0, _Block()
    while True:
        try:
            row = next(lines, None)
        except Exception as err:  # this process failed: the others learn of it in this round, and all stop
            failed = _Block(failure=_failure(processes, err))
            _round(processes, failed, writer, summary, bar, own_error=err)
            raise  # _round has raised already; kept for type checkers
        if row is None:
            break
        index, line, text, words, truncated, windows, untagged = row
        block.rows.append((index, line, text))
        block.tokens += words
        block.truncated += truncated
        block.windowed += windows > 1
        block.untagged += untagged
        if len(block.rows) == share.block:
            _round(processes, block, writer, summary, bar)
            rounds, block = rounds + 1, _Block()
    if block.rows:
        _round(processes, block, writer, summary, bar)
        rounds += 1
    while rounds < share.rounds(seen.dealt):  # the others' last blocks, once this process has run out
        _round(processes, _Block(), writer, summary, bar)
        rounds += 1
    summary.seconds = perf_counter() - start
    return seen


def _round(
    processes: Processes,
    mine: _Block,
    writer: RunWriter | None,
    summary: PredictSummary,
    bar: tqdm,
    own_error: BaseException | None = None,
) -> None:
    """Gather and write one block from every process.

    Gather one block from every process on the main one, which writes them in rank order (input order); then
    every process learns whether one of them failed, and if so stops."""
    gathered = processes.gather(mine)
    verdict = None
    if gathered is not None:
        verdict = next((b.failure for b in gathered if b.failure is not None), None)
        if verdict is None and writer is not None:
            for b in gathered:
                for index, line, text in b.rows:
                    writer.record(index, line, text)
                summary.predicted += len(b.rows)
                summary.tokens += b.tokens
                summary.truncated += b.truncated
                summary.windowed += b.windowed
                summary.untagged_words += b.untagged
                bar.update(len(b.rows))
    verdict = processes.broadcast(verdict)
    if verdict is not None:
        _stop(processes, verdict, own_error)


def _agree(processes: Processes, prepare: Callable[[], T]) -> T:
    """Run ``prepare()`` on every process and stop all if any fails.

    ``prepare()`` on every process; when it fails on any of them, every process stops (the main one with that
    process's error) rather than wait for the others at the first round."""
    try:
        result, failure, error = prepare(), None, None
    except Exception as err:
        result, failure, error = None, _failure(processes, err), err
    gathered = processes.gather(failure)
    first = next((f for f in gathered if f is not None), None) if gathered is not None else None
    verdict = processes.broadcast(first)
    if verdict is not None:
        _stop(processes, verdict, error)
    return result


def _failure(processes: Processes, err: Exception) -> tuple[int, str, str]:
    """This process's failure.

    (rank, kind, message) of this process's failure. Kinds: 'data', a bad record (every process meets the same
    first one, so its message is the one a single process gives); 'user', another user error (a file one machine
    cannot see); 'crash', anything else, with its type."""
    if isinstance(err, DataError):
        return processes.rank, "data", str(err)
    if isinstance(err, UserError):
        return processes.rank, "user", str(err)
    return processes.rank, "crash", f"{type(err).__name__}: {err}"


def _stop(processes: Processes, verdict: tuple[int, str, str], own_error: BaseException | None) -> None:
    """Raise on every process once one has failed.

    The failed process its own error (a traceback for a bug); the
    main process a bad record's error as one process gives it, or the failed rank's error naming the rank; the
    others a line saying they stopped with it."""
    rank, kind, message = verdict
    if own_error is not None and rank == processes.rank:
        raise own_error
    if kind == "data" and isinstance(own_error, DataError):
        raise own_error  # this process met the bad record too
    if processes.is_main:
        if kind == "data":
            raise UserError(message)
        if kind == "user":
            raise UserError(f"rank {rank} of {processes.world}: {message}")
        raise ProcessFailed(f"rank {rank} of {processes.world} failed: {message}; nothing was written")
    raise ProcessFailed(f"rank {processes.rank}: stopped with rank {rank} (rank 0 reports why)")


def _footer(
    share: Share,
    reader: InputReader,
    seen: _Reading,
    summary: PredictSummary,
    on_error: str,
    tasks: list[str],
    identity: dict[str, Any],
) -> dict[str, Any]:
    """What a part says of itself, for merge-predictions' checks and counts (see parts.SAME and parts.COUNTS)."""
    return {
        "shard": share.shard,
        "shards": share.shards,
        "block": share.block,
        "input": Path(reader.path).name,
        "input_sha256": seen.digest.hexdigest(),
        **identity,
        "records": seen.records,
        "empty_lines": reader.empty_lines,
        "on_error": on_error,
        "tasks": tasks,
        "precision": summary.precision,
        **{key: getattr(summary, key) for key in COUNTS},
        "seconds": summary.seconds,
    }
