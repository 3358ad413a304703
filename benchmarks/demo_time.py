"""The demo's time: `mtl-decoder train --config configs/demo.yaml` run once, timed, with the quality it reaches.

    python benchmarks/demo_time.py --label after                       # run the demo, record it as runs.after
    python benchmarks/demo_time.py --label before training.epochs=16   # the same with overrides
    python benchmarks/demo_time.py --label before --from-run DIR --wall-s S --cpu-s S   # a run timed elsewhere

Writes benchmarks/results/demo_time.json: per label the wall-clock and CPU seconds of the whole command (start-up,
tokenizer, training, validations, saving), the machine (CPU model, cores, OMP_NUM_THREADS, load average at the
start, which says how shared the machine was), the steps, the best step and its validation metrics. Other labels
already in the file are kept. Run it on an otherwise idle machine for a figure a reader can expect.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULT = REPO / "benchmarks" / "results" / "demo_time.json"
CONFIG = "configs/demo.yaml"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average_at_start": round(os.getloadavg()[0], 2),
    }


def run_demo(output_dir: Path, overrides: list[str]) -> tuple[float, float]:
    """Wall-clock and CPU seconds (user + system, the child's) of one demo run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    command = ["mtl-decoder", "train", "--config", CONFIG, "--output-dir", str(output_dir), *overrides]
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def run_record(run_dir: Path, wall: float, cpu: float, overrides: list[str], host: dict[str, Any]) -> dict[str, Any]:
    """One measurement: the timing, the machine, and what the run's summary.json says it reached."""
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    validations = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line).get("type") == "validation"
    ]
    return {
        "command": f"mtl-decoder train --config {CONFIG}" + "".join(f" {o}" for o in overrides),
        **host,
        "wall_s": round(wall, 1),
        "wall_min": round(wall / 60, 2),
        "cpu_s": round(cpu, 1),
        "training_wall_s": round(summary["wall_time_s"], 1),
        "steps": summary["steps"],
        "validations": len(validations),
        "best_step": summary["best_step"],
        "best_score": round(summary["best_score"], 4),
        "validation": {
            "ner_f1": round(summary["validation"]["ner"]["f1"], 4),
            "sentiment_accuracy": round(summary["validation"]["sentiment"]["accuracy"], 4),
        },
    }


def write(label: str, record: dict[str, Any]) -> None:
    results = json.loads(RESULT.read_text(encoding="utf-8")) if RESULT.exists() else {}
    results.setdefault("runs", {})[label] = record
    tmp = RESULT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    tmp.replace(RESULT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="the key under runs (e.g. before, after)")
    parser.add_argument("--from-run", type=Path, help="record a finished run folder instead of running the demo")
    parser.add_argument("--wall-s", type=float, help="with --from-run: its measured wall-clock seconds")
    parser.add_argument("--cpu-s", type=float, help="with --from-run: its measured CPU seconds")
    parser.add_argument("overrides", nargs="*", help="config overrides passed to train")
    args = parser.parse_args(argv)
    host = machine()
    if args.from_run is not None:
        if args.wall_s is None or args.cpu_s is None:
            parser.error("--from-run needs --wall-s and --cpu-s")
        record = run_record(args.from_run, args.wall_s, args.cpu_s, args.overrides, host)
        record["load_average_at_start"] = None  # not known for a run timed elsewhere
    else:
        with tempfile.TemporaryDirectory(prefix="demo-time-") as tmp:
            wall, cpu = run_demo(Path(tmp) / "run", args.overrides)
            record = run_record(Path(tmp) / "run", wall, cpu, args.overrides, host)
    write(args.label, record)
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
