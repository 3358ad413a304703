"""``evaluate``: per-task metrics and expert utilisation of a saved model on a split or on given files.

    mtl-decoder evaluate --model RUN/best [--split test] [--tasks a,b] [--data TASK=PATH ...] [--output DIR]

Predictions go through the same Predictor, batch size and scoring functions as training-time validation,
so ``--split validation`` on RUN/best reproduces RUN/best/info.json exactly. Writes ``metrics.json``
(schema: SCHEMA.md), ``report.md`` and ``plots/`` to DIR (default MODEL/eval-SPLIT).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mtl_decoder.config import SPLITS, ExperimentConfig, TaskConfig, parse_task_names
from mtl_decoder.data.tasks import Source, check_labels, load_split, source_key
from mtl_decoder.errors import UserError, did_you_mean
from mtl_decoder.evaluation.metrics import selection_score
from mtl_decoder.evaluation.novelty import Analyser, replace_split, training_surfaces
from mtl_decoder.evaluation.report import render_report
from mtl_decoder.evaluation.scoring import score_sources
from mtl_decoder.evaluation.utilisation import COVERAGE, UtilisationTracker
from mtl_decoder.files import atomic_write_text, check_writable_parent, staged_folder
from mtl_decoder.inference import InferenceOptions, Predictor
from mtl_decoder.inference.loading import load_for_inference
from mtl_decoder.inference.options import PRECISION
from mtl_decoder.paths import check_outside_model, os_reason
from mtl_decoder.processes import Processes
from mtl_decoder.saved import CONFIG_FILE

METRICS_FILE = "metrics.json"
REPORT_FILE = "report.md"
PLOTS_DIR = "plots"


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    """The content of metrics.json: model, split, data, summary, tasks, experts, settings, notes."""
    output_dir: Path
    """Where metrics.json, report.md and plots/ were written."""
    states: dict[str, int] | None = None
    """A frozen trunk's state cache over the run (as PredictSummary.states), None for other models."""

    @property
    def tasks(self) -> dict[str, dict[str, Any]]:
        return self.metrics["tasks"]

    @property
    def experts(self) -> dict[str, dict[str, Any]]:
        return self.metrics["experts"]

    @property
    def score(self) -> float:
        return self.metrics["summary"]["selection_score"]


def evaluate(
    model_dir: str | Path,
    split: str = "test",
    tasks: Iterable[str] | str | None = None,
    data: Mapping[str, str | Path] | Iterable[str] | None = None,
    output_dir: str | Path | None = None,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    precision: str = PRECISION,
    cache_states: bool = False,
    cache_dir: str | Path | None = None,
    progress: bool | None = None,
    max_tokens: int | None = None,
    train_data: Mapping[str, str | Path] | Iterable[str] | None = None,
    engine: str = "torch",
    pack_tokens: int | None = None,
    refine: bool = True,
    *,
    options: InferenceOptions | None = None,
) -> EvalResult:
    """Evaluate the model in ``model_dir`` on ``split`` (the files the run's task files name for it).

    ``tasks``: names (or a comma string) to evaluate; default all, or with ``data`` the tasks it names.
    ``data``: task -> file (or "TASK=PATH" strings) read with the task's own columns instead of its split.
    ``output_dir``: default MODEL/eval-SPLIT, the model's own report folder; any other must lie outside the model
    folder (``paths.check_outside_model``).
    ``batch_size``: default the run's data.eval_batch_size, the size training-time validation used.
    ``device``: default the machine's accelerator when it has one, else the CPU.
    ``precision``: fp32, bf16 / fp16 autocast, or int8 (see mtl_decoder.inference.PRECISIONS).
    ``cache_states``, ``cache_dir``: a frozen trunk's state cache (see Predictor.from_saved): read from its folder
    under ``cache_dir`` (default the model's), written only with ``cache_states``.
    ``progress``: a progress bar of examples on stderr (None: only when stderr is a terminal).
    ``max_tokens``: a batch's padded sub-words at most (None: the model's default, Predictor.default_max_tokens;
    0: rows only); the metrics do not depend on it beyond float rounding.
    ``train_data``: task -> training file (or "TASK=PATH" strings) whose entities count as seen, for the seen/unseen
    F1 of tagging tasks (default: the run's own train split, where that file is still there; see novelty.py).
    ``engine``: torch, or onnx (the folder's graph from export --format onnx, on ONNX Runtime).
    ``pack_tokens``: a pretrained trunk's texts packed into rows of at most this many ids (None: the default,
    packing.PACK_TOKENS; 0: padded batches); the metrics do not depend on it beyond float rounding.
    ``refine``: int8 with a folder's W8A8 scales predicts its close texts again in float32 (inference/refine.py).
    ``options``: these settings as one mtl_decoder.inference.InferenceOptions instead of keywords (its batch_size
    None: the run's); its workers and gate table are not used by evaluate.

    Under a launcher (torchrun, accelerate launch) each process predicts its blocks of every source on its own
    device (``device`` is then each process's own); the predictions and the gate statistics are gathered, so the
    task metrics are those of one process exactly and the utilisation up to float rounding. The main process writes.
    """
    processes = Processes.join()
    if split not in SPLITS:
        raise UserError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)}){did_you_mean(split, SPLITS)}")
    if options is None:
        given = dict(batch_size=batch_size, device=device, precision=precision, cache_states=cache_states,
                     cache_dir=cache_dir, max_tokens=max_tokens, engine=engine, pack_tokens=pack_tokens,
                     refine=refine)  # fmt: skip
        options = InferenceOptions(**given)
    options = options.checked(flags=True).on_device(processes.device)  # a launcher's process: its own device
    default = Path(model_dir) / f"eval-{split}"
    out_dir = Path(output_dir) if output_dir is not None else default
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--output {out_dir}: exists and is not a directory")
    check_outside_model(out_dir, model_dir, own=default)
    if processes.is_main:  # the one that writes (another machine's processes may not see its folder)
        check_writable_parent(out_dir / METRICS_FILE, "--output")
    saved = load_for_inference(model_dir, dataclasses.replace(options, gate_table=None))
    cfg = saved.config
    overrides = parse_data(data, list(cfg.tasks))
    train_files = parse_data(train_data, list(cfg.tasks), flag="--train-data")
    names = select_tasks(tasks, overrides, list(cfg.tasks))
    task_cfgs = with_overrides(cfg, split, overrides)
    for name in names:
        if source_key(task_cfgs[name], split) is None:
            raise UserError(
                f"task '{name}' has no '{split}' data in {Path(model_dir) / CONFIG_FILE}: "
                f"pass --data {name}=PATH or choose another --split"
            )

    sources = load_split(task_cfgs, split, names, repair_iob=cfg.data.repair_iob)
    seen, novelty_notes = training_surfaces(cfg.tasks, names, train_files, cfg.data.repair_iob)
    analysis = Analyser(seen)
    for source in sources:
        check_labels(source, saved.label_sets, split)
    tracker = UtilisationTracker(saved.model, cfg.evaluation.position_buckets, cfg.evaluation.dead_expert_fraction)
    predictor = Predictor.from_saved(saved, dataclasses.replace(options, workers=None))
    distribute = processes.distribute(predictor.buffer) if processes.world > 1 else None
    show = (sys.stderr.isatty() if progress is None else progress) and processes.is_main
    total = sum(len(s.examples) for s in sources)
    with tqdm(total=total, desc="evaluate", unit=" examples", disable=not show, delay=1.0, file=sys.stderr) as bar:
        predictor.progress = bar.update
        scored = score_sources(predictor, sources, task_cfgs, saved.label_sets, names, tracker, distribute, analysis)
    predictor.progress = None
    if processes.world > 1:
        tracker.merge(processes.all_gather(tracker.stats))
    task_metrics = {name: scored[name] for name in names}
    cache = predictor.state_cache
    if cache is not None:
        cache.flush()  # --cache-states: the last shard

    metrics = {
        "model": str(model_dir),
        "split": split if any(name not in overrides for name in names) else None,
        "data": _data_section(sources, names, overrides),
        "summary": _summary(cfg, task_metrics),
        "tasks": task_metrics,
        "experts": tracker.summary(),
        "analysis": analysis.results,
        "settings": {
            "ffn": cfg.model.ffn,
            "batch_size": predictor.batch_size,
            "precision": options.precision,
            "max_tokens": predictor.max_tokens,
            "position_buckets": list(cfg.evaluation.position_buckets),
            "dead_expert_fraction": cfg.evaluation.dead_expert_fraction,
            "initial_shared_weight": cfg.model.initial_shared_weight,
            "coverage": COVERAGE,
        },
        "notes": tracker.notes() + novelty_notes,
    }
    if processes.is_main:
        write_outputs(metrics, out_dir)
    states = None if cache is None else {"computed": cache.misses, "cached": cache.hits, "repeated": cache.repeats}
    return EvalResult(metrics, out_dir, states)


# ------------------------------------------------------------------------------------------------ arguments


def parse_data(
    data: Mapping[str, str | Path] | Iterable[str] | None, known: list[str], flag: str = "--data"
) -> dict[str, str]:
    """task -> path from a mapping or "TASK=PATH" strings; unknown tasks, bad pairs and repeats are errors."""
    if not data:
        return {}
    pairs: list[tuple[str, str]] = []
    if isinstance(data, Mapping):
        pairs = [(str(k), str(v)) for k, v in data.items()]
    else:
        for item in data:
            task, sep, path = str(item).partition("=")
            if not sep or not task.strip() or not path.strip():
                raise UserError(f"{flag} '{item}': expected TASK=PATH, e.g. {flag} {known[0]}=my_file.jsonl")
            pairs.append((task.strip(), path.strip()))
    out: dict[str, str] = {}
    for task, path in pairs:
        if task not in known:
            raise UserError(f"{flag}: unknown task '{task}' (tasks: {', '.join(known)}){did_you_mean(task, known)}")
        if task in out and out[task] != path:
            raise UserError(f"{flag}: task '{task}' given twice ({out[task]} and {path})")
        out[task] = path
    return out


def select_tasks(tasks: Iterable[str] | str | None, overrides: dict[str, str], known: list[str]) -> list[str]:
    """The tasks to evaluate, in the run's order. With --data and no --tasks: only the tasks --data names."""
    wanted = parse_task_names(tasks, known)
    if wanted is None:
        return [t for t in known if t in overrides] if overrides else list(known)
    left_out = [t for t in overrides if t not in wanted]
    if left_out:
        raise UserError(f"--data names task '{left_out[0]}', which --tasks leaves out")
    return [t for t in known if t in wanted]


def with_overrides(cfg: ExperimentConfig, split: str, overrides: dict[str, str]) -> dict[str, TaskConfig]:
    """The run's tasks with some splits pointed at given local files.

    The run's tasks, with ``data.<split>`` of the overridden ones pointing at the given local file (their
    columns, labels and kind unchanged, so the file is read exactly as the task's own split would be)."""
    tasks = dict(cfg.tasks)
    for name, path in overrides.items():
        tasks[name] = replace_split(cfg.tasks[name], split, path)
    return tasks


# ------------------------------------------------------------------------------------------------ results


def _data_section(sources: list[Source], names: list[str], overrides: dict[str, str]) -> dict[str, dict[str, Any]]:
    out = {}
    for source in sources:
        for task in source.tasks:
            if task.name in names:
                out[task.name] = {
                    "source": source.key,
                    "examples": len(source.examples),
                    "from_data_flag": task.name in overrides,
                }
    return {name: out[name] for name in names}


def _summary(cfg: ExperimentConfig, task_metrics: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The run's selection score (weighted mean of primary metrics) over the evaluated tasks, as in training."""
    return {
        "selection_score": float(selection_score(cfg.tasks, task_metrics)),
        "primary": {
            name: {
                "metric": cfg.tasks[name].primary_metric,
                "value": float(m[cfg.tasks[name].primary_metric]),
                "weight": float(cfg.tasks[name].metric_weight),
            }
            for name, m in task_metrics.items()
        },
    }


def write_outputs(metrics: dict[str, Any], out_dir: Path) -> None:
    """metrics.json and report.md (each written whole, then renamed into place) and plots/."""
    from mtl_decoder.evaluation.plots import write_plots

    try:
        with staged_folder(out_dir) as stage:  # the outputs appear together, or (an error, SIGTERM) not at all
            plots = write_plots(metrics, stage / PLOTS_DIR)
            atomic_write_text(stage / METRICS_FILE, json.dumps(metrics, indent=2) + "\n")
            report = render_report(metrics, [p.relative_to(stage).as_posix() for p in plots])
            atomic_write_text(stage / REPORT_FILE, report)
    except OSError as err:  # a full disk where no closer layer named the file (a plot's writer)
        raise UserError(f"{out_dir}: cannot write the evaluation ({os_reason(err)})") from None
