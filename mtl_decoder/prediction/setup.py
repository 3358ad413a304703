"""The one prediction set-up of every prediction path.

The one prediction set-up of ``predict_texts``, ``predict_file`` and its multi-process and sharded form: the
options and the targets checked, then the model loaded (``inference.options.load_for_inference``), its tasks
resolved and its Predictor built; for a file, the reader, the summary and a killed run's temporaries removed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtl_decoder.data.inputs import InputReader
from mtl_decoder.errors import UserError
from mtl_decoder.files import remove, stale_temporaries
from mtl_decoder.inference import InferenceOptions, Predictor
from mtl_decoder.inference.loading import load_for_inference
from mtl_decoder.prediction.common import ON_ERROR, PredictSummary, resolve_tasks
from mtl_decoder.prediction.outputs import check_targets, errors_path
from mtl_decoder.prediction.parts import check_part_target
from mtl_decoder.saved import SavedModel


def parse_shard(shard: str | tuple[int, int]) -> tuple[int, int]:
    """(K, N) from 'K/N' or a pair; a UserError unless 0 <= K < N."""
    text = f"{shard[0]}/{shard[1]}" if isinstance(shard, tuple) else str(shard)
    k, sep, n = text.partition("/")
    if not (sep and k.strip().isdigit() and n.strip().isdigit()) or not 0 <= int(k) < int(n):
        raise UserError(f"--shard must be K/N with 0 <= K < N (e.g. --shard 0/4), got '{text}'")
    return int(k), int(n)


@dataclass
class Prepared:
    """A loaded model ready to predict: the folder, the tasks to predict and its Predictor."""

    saved: SavedModel
    tasks: list[str]
    predictor: Predictor


def prepare_model(
    model: SavedModel | str | Path, options: InferenceOptions, tasks: str | Sequence[str] | None
) -> Prepared:
    """Load ``model`` as ``options`` say (checked already), resolve ``tasks`` and build the Predictor."""
    saved = load_for_inference(model, options)
    names = resolve_tasks(saved, tasks)
    return Prepared(saved, names, Predictor.from_saved(saved, options))


@dataclass
class FileJob:
    """What ``predict_file`` (one process, several, or one shard) reads and writes, checked before any model loads."""

    input: str | Path
    output: Path
    tasks: str | Sequence[str] | None = None
    fmt: str | None = None
    text_column: str = "text"
    on_error: str = "fail"
    force: bool = False
    shard: tuple[int, int] | None = None
    """(K, N) of a sharded job, else None."""

    @property
    def skip(self) -> bool:
        return self.on_error == "skip"

    @property
    def errors(self) -> Path:
        return errors_path(self.output)


@dataclass
class FileRun:
    """A file job set up: its reader, model and summary (on every process of a launched run)."""

    job: FileJob
    reader: InputReader
    prepared: Prepared
    summary: PredictSummary


def file_job(input: str | Path, output: str | Path, shard: str | tuple[int, int] | None, **fields: Any) -> FileJob:
    """A FileJob from ``predict_file``'s arguments, its on_error and shard checked."""
    job = FileJob(input, Path(output), shard=parse_shard(shard) if shard is not None else None, **fields)
    if job.on_error not in ON_ERROR:
        raise UserError(f"on_error must be one of {', '.join(ON_ERROR)}, got '{job.on_error}'")
    return job


def prepare_file_run(
    job: FileJob, model: SavedModel | str | Path, options: InferenceOptions, writes: bool = True
) -> FileRun:
    """Everything a file prediction does before its first record is read.

    Everything before the first record is read, in order: the input opened, the targets checked (only where
    ``writes``: the process that writes them), the model loaded, and (``writes``) a killed run's temporaries of the
    output and its errors file removed."""
    reader = InputReader(job.input, job.fmt, job.text_column)
    if writes:
        if job.shard is not None:
            check_part_target(job.input, job.output, job.force, model)
        else:
            check_targets(job.input, job.output, job.errors, job.skip, job.force, model)
    prepared = prepare_model(model, options, job.tasks)
    errors_file = str(job.errors) if job.skip and job.shard is None else None  # a shard's skipped records: its part
    summary = PredictSummary(str(job.input), str(job.output), errors_file, precision=options.precision)
    if writes:
        for stale in stale_temporaries(job.output) + stale_temporaries(job.errors):  # left by a killed run
            remove(stale)
            summary.removed.append(str(stale))
    return FileRun(job, reader, prepared, summary)
