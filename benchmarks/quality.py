"""Real-data quality: train and evaluate the benchmark models on the full data in ../shared/data.

    python benchmarks/quality.py                       # everything (several hours on a 2-core CPU)
    python benchmarks/quality.py --models ple,mlp      # some of them
    python benchmarks/quality.py --table               # print the table of what benchmarks/results holds
    python benchmarks/quality.py --models distill_x --retime   # a distill row's student timed again, not trained

Each model trains in its own process for the number of steps its config sets (training.max_steps), so what a
run learns does not depend on the machine's speed; training.max_minutes (--minutes, default 120) is only a
safety net, and if it binds, the learning-rate schedule follows the elapsed fraction of it, so the run still
ends cooled down. Each model selects its checkpoint on validation only and is then evaluated on validation and
test with the same code as `mtl-decoder evaluate`. Results go to benchmarks/results/quality.json (merged with
earlier runs): per run its metrics, steps, why it stopped (`stop_reason`: 'done' = its step budget,
'time_budget' = the wall-clock cap, 'early_stopping'), the steps it was resumed at (`resumed_from`), wall
time, tokens/s, parameters, peak memory, and the machine (CPU model, whether it has AVX-512). A markdown table
is printed, with footnotes for runs that were resumed or stopped by the cap.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from distill_rows import DISTILL_MODELS, distill_command, distill_facts, teacher_folder, words_per_cpu_s

# The parts beside this script: the models, the table, what a run records; every name stays importable from here
# (benchmarks/peers/ imports carve_semeval and machine).
from quality_models import BENCH, DEFAULT, DEFAULT_MINUTES, MODELS, REPO, TASK_FILES
from quality_record import OwnMemoryPeak, cpu_info, machine, save_run  # noqa: F401
from quality_table import (  # noqa: F401
    CAPPED,
    CONLL_SST2_COLUMNS,
    PRIMARY,
    RESUMED,
    SEMEVAL_COLUMNS,
    SINGLE_PAIRS,
    STATES,
    footnotes,
    machine_line,
    resumed,
    single_pairs,
    table,
)


def carve_semeval(data_root: Path, out_dir: Path, fraction: float = 0.1, seed: int = 0) -> tuple[Path, Path]:
    """SemEval-14 has no validation split: hold out ``fraction`` of train with a fixed seed."""
    lines = [line for line in (data_root / "semeval14_restaurants" / "train.jsonl").read_text().splitlines() if line]
    order = list(range(len(lines)))
    random.Random(seed).shuffle(order)
    held = set(order[: round(fraction * len(lines))])
    out_dir.mkdir(parents=True, exist_ok=True)
    train, val = out_dir / "semeval_train.jsonl", out_dir / "semeval_validation.jsonl"
    for path, keep in ((train, False), (val, True)):
        text = "".join(lines[i] + "\n" for i in range(len(lines)) if (i in held) == keep)
        # two quality.py processes may carve at once while a run reads the files: rewrite only what differs,
        # and by rename, so a reader never sees a half-written file
        if not path.is_file() or path.read_text() != text:
            partial = path.with_suffix(".partial")
            partial.write_text(text)
            partial.replace(path)
    return train, val


def data_overrides(config: Path, data_root: Path, carved: tuple[Path, Path] | None) -> list[str]:
    """Point the config's tasks at --data-root (and SemEval at its carved train/validation files)."""
    import yaml

    overrides = []
    for entry in yaml.safe_load(config.read_text())["tasks"]:
        name = yaml.safe_load((config.parent / entry).read_text())["name"]
        folder = data_root / TASK_FILES[name]
        if name.startswith("semeval14"):
            overrides += [
                f"tasks.{name}.data.train={carved[0]}",
                f"tasks.{name}.data.validation={carved[1]}",
                f"tasks.{name}.data.test={folder / 'test.jsonl'}",
            ]
        else:
            overrides += [
                f"tasks.{name}.data.{split}={folder / f'{split}.jsonl'}" for split in ("train", "validation", "test")
            ]
    return overrides


def train_one(name: str, args: argparse.Namespace, carved: tuple[Path, Path] | None) -> dict:
    config_file, variant, _ = MODELS[name]
    config = BENCH / config_file
    run_dir = args.runs_dir / name
    overrides = [
        *data_overrides(config, args.data_root, carved),
        *variant,
        f"training.max_minutes={args.minutes}",
        "training.progress=false",
        *args.override,
    ]
    cmd = [sys.executable, "-m", "mtl_decoder", "train", "--config", str(config), "--output-dir", str(run_dir)]
    if name in DISTILL_MODELS:
        teacher = teacher_folder(args.teacher_flag, name)  # a row may name its own teacher (ROW_TEACHERS)
        distilled = distill_command(name, config, run_dir, teacher, args.data_root)
        cmd = [sys.executable, "-m", "mtl_decoder", *distilled]
    resume = (run_dir / "checkpoints").is_dir() and not (run_dir / "summary.json").is_file()
    if (run_dir / "config.yaml").is_file() and not resume:
        raise SystemExit(f"{run_dir} holds a finished run: remove it to train {name} again")
    log = (args.runs_dir / f"{name}.log").open("a")
    print(f"[{name}] training -> {run_dir} (log: {log.name})", flush=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*cmd, *(["--resume"] if resume else []), *overrides], stdout=log, stderr=subprocess.STDOUT, cwd=REPO
    )
    own_memory = OwnMemoryPeak(proc.pid)
    _, status, usage = os.wait4(proc.pid, 0)
    own_peak = own_memory.stop()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"[{name}] training failed (exit {proc.returncode}); see {log.name}")
    summary = json.loads((run_dir / "summary.json").read_text())
    resumed_from = summary.get("resumed_from", [])
    return {
        "description": MODELS[name][2],
        "overrides": variant,
        "config": str(config.relative_to(REPO)),
        "train_minutes": summary["wall_time_s"] / 60,
        "process_minutes": (time.perf_counter() - started) / 60,
        "steps": summary["steps"],
        "best_step": summary["best_step"],
        "stop_reason": summary["stop_reason"],
        "resumed_from": resumed_from,
        "resumed": bool(resumed_from),
        "minutes_cap": args.minutes,
        "tokens_per_s": summary["tokens_per_s"],
        "parameters": summary["parameters"],
        "peak_memory_mb": usage.ru_maxrss / 1024,  # of the last process only, when the run was resumed
        "peak_own_memory_mb": own_peak,  # RssAnon: without the mapped state cache's pages (sampled every 5 s)
        "state_cache_minutes": summary.get("state_cache_seconds", 0.0) / 60,  # frozen trunk, once; not training
    }


def evaluate_one(name: str, args: argparse.Namespace) -> dict:
    from mtl_decoder.evaluation.evaluate import evaluate

    best = args.runs_dir / name / "best"
    out = {}
    for split in ("validation", "test"):
        result = evaluate(best, split=split, output_dir=best / f"eval-{split}")
        out[split] = {task: _headline(m) for task, m in result.metrics["tasks"].items()}
    return out


def _headline(metrics: dict) -> dict:
    keys = ("f1", "f1_strict", "precision", "recall", "accuracy", "macro_f1")
    return {k: metrics[k] for k in keys if k in metrics}


def retime(name: str, args: argparse.Namespace, results: dict) -> dict:
    """Row ``name``'s entry with its student's speed measured again on this machine (its quality unchanged)."""
    if name not in DISTILL_MODELS or name not in results["runs"]:
        raise SystemExit(f"--retime: {name!r} is not a distill row with a result in {args.results}")
    run = dict(results["runs"][name])
    before = run.get("words_per_cpu_s")
    run.update(words_per_cpu_s(args.runs_dir / name / "best", args.data_root))
    run["retimed"] = {"words_per_cpu_s_before": before, **machine()}
    print(f"[{name}] {before} -> {run['words_per_cpu_s']} words per CPU-second", flush=True)
    return save_run(args.results, name, run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--runs-dir", type=Path, default=REPO / "benchmarks" / "runs")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results" / "quality.json")
    parser.add_argument(
        "--minutes",
        type=float,
        default=DEFAULT_MINUTES,
        help="wall-clock safety cap per model (runs are bound by their configs' max_steps)",
    )
    parser.add_argument("--override", action="append", default=[], help="extra key=value for every model")
    parser.add_argument("--table", action="store_true", help="only print the table of the saved results")
    parser.add_argument("--retime", action="store_true", help="distill_* rows: time the finished run's student "
                        "again (words_per_cpu_s, this machine) instead of training it")  # fmt: skip
    parser.add_argument("--teacher", help="distill_* rows: the teacher folder (default: $MTL_DECODER_TEACHER, else "
                        "benchmarks/runs/smollm2_frozen_ple/best)")  # fmt: skip
    args = parser.parse_args()
    args.teacher_flag, args.teacher = args.teacher, teacher_folder(args.teacher)
    results = json.loads(args.results.read_text()) if args.results.is_file() else {"runs": {}}
    if not args.table:
        args.runs_dir.mkdir(parents=True, exist_ok=True)
        names = args.models.split(",")
        for name in names:
            if name not in MODELS:
                raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
        semeval = any("semeval" in MODELS[n][0] for n in names)
        carved = carve_semeval(args.data_root, args.runs_dir / "data") if semeval else None
        for name in names:
            if args.retime:
                results = retime(name, args, results)
                continue
            run = train_one(name, args, carved)
            run["metrics"] = evaluate_one(name, args)
            if name in DISTILL_MODELS:
                run.update(distill_facts(args.runs_dir / name))
                run.update(words_per_cpu_s(args.runs_dir / name / "best", args.data_root))
            run.update(machine())
            results = save_run(args.results, name, run)
            print(f"[{name}] {run['steps']} steps ({run['stop_reason']}) in {run['train_minutes']:.1f} min", flush=True)
    print(table(results["runs"]))


if __name__ == "__main__":
    main()
