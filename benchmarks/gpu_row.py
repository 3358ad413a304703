"""The GPU row end to end through the CLI a user types, on one accelerator: train under `accelerate launch`
(bf16 autocast), evaluate the best model on validation and test (bf16, and test in fp32), predict a file; every
command's exit status, time and, where it failed, the end of its output are recorded, so a broken step is reported
rather than hidden, and the steps after it still run where they can.

    python benchmarks/smollm2_checkpoint.py        # -> benchmarks/runs/smollm2-135m-instruct
    python benchmarks/gpu_row.py [--config CONFIG] [--logs DIR] [-- TRAIN OVERRIDES ...]

Results: benchmarks/results/gpu_<config stem>.json (the machine, the library versions, each step, the run's
summary and validations, each evaluation's primary metrics and seen/unseen entity F1, the prediction speed).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_CONFIG = REPO / "configs" / "bench" / "smollm2_upcycle_bidirectional_gpu.yaml"
# evaluate's flags per evaluation: bf16 is what a GPU user runs; fp32 on test shows what bf16 changes.
EVALUATIONS = {
    "validation_bf16": ["--split", "validation", "--precision", "bf16"],
    "test_bf16": ["--split", "test", "--precision", "bf16"],
    "test_fp32": ["--split", "test", "--precision", "fp32"],
}
PREDICT_INPUT = REPO.parent / "shared" / "data" / "conll2003" / "test.jsonl"


def cli() -> list[str]:
    """The installed `mtl-decoder` command, or the same entry point through the interpreter."""
    found = shutil.which("mtl-decoder")
    return [found] if found else [sys.executable, "-m", "mtl_decoder"]


def launcher() -> list[str]:
    """`accelerate launch` for one process on this machine's one accelerator."""
    found = shutil.which("accelerate")
    launch = [found, "launch"] if found else [sys.executable, "-m", "accelerate.commands.launch"]
    return [*launch, "--num_processes", "1", "--num_machines", "1", "--dynamo_backend", "no"]


def run_step(name: str, command: list[str], logs: Path) -> dict:
    """Run one command, its output to logs/NAME.log; what it returned, how long it took, and its last lines."""
    log = logs / f"{name}.log"
    print(f"== {name}: {' '.join(command)}", flush=True)
    start = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    step = {"command": command, "rc": rc, "seconds": round(seconds, 1)}
    if rc != 0:
        step["output_tail"] = log.read_text(errors="replace")[-4000:]
    print(f"   rc {rc} in {seconds:.1f} s", flush=True)
    return step


def machine() -> dict:
    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__}
    for package in ("transformers", "accelerate", "tokenizers", "peft"):
        try:
            info[package] = __import__(package).__version__
        except ImportError:
            info[package] = None
    if torch.cuda.is_available():
        info["accelerator"] = torch.cuda.get_device_name(0)
        info["accelerator_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


def evaluation(folder: Path) -> dict | None:
    """An evaluation's primary metrics, and its seen/unseen entity F1 where it has one."""
    path = folder / "metrics.json"
    if not path.is_file():
        return None
    metrics = json.loads(path.read_text())
    out = {"primary": {task: p["value"] for task, p in metrics["summary"]["primary"].items()}}
    out["settings"] = {k: metrics["settings"].get(k) for k in ("precision", "batch_size", "max_tokens")}
    novelty = {task: a.get("novelty") for task, a in metrics.get("analysis", {}).items() if a.get("novelty")}
    if novelty:
        out["novelty"] = novelty
    return out


def prediction_speed(input_path: Path, output_path: Path, seconds: float) -> dict | None:
    """Words and sentences predicted per second of the whole command (model loading included)."""
    if not output_path.is_file():
        return None
    sentences = [json.loads(line) for line in input_path.read_text().splitlines() if line.strip()]
    words = sum(len(s["tokens"]) for s in sentences)
    written = sum(1 for line in output_path.read_text().splitlines() if line.strip())
    return {"sentences": len(sentences), "written": written, "words": words,
            "words_per_s_with_loading": round(words / seconds, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--logs", type=Path, default=REPO / "benchmarks" / "runs" / "gpu_row_logs")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the results file")
    parser.add_argument(
        "--evaluations", default=",".join(EVALUATIONS), help=f"which of {', '.join(EVALUATIONS)}, comma-separated"
    )
    parser.add_argument("overrides", nargs="*", help="train overrides (KEY=VALUE), after --")
    args = parser.parse_args()
    args.config = args.config.resolve()
    sys.path.insert(0, str(REPO))
    from mtl_decoder.config import load_config

    cfg = load_config(args.config, args.overrides)
    run = Path(cfg.training.output_dir)
    run = run if run.is_absolute() else REPO / run
    best = run / "best"
    args.logs.mkdir(parents=True, exist_ok=True)
    result: dict = {"config": str(args.config.relative_to(REPO)), "overrides": args.overrides, "machine": machine()}
    out = args.results / f"gpu_{args.config.stem}.json"
    steps: dict[str, dict] = {}
    result["steps"] = steps

    def save() -> None:  # after every step: a run cut short still leaves what it measured
        text = json.dumps(result, indent=2) + "\n"
        for path in (out, args.logs / out.name):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    steps["train"] = run_step(
        "train", [*launcher(), "-m", "mtl_decoder", "train", "--config", str(args.config), "--overwrite",
                  *args.overrides], args.logs)  # fmt: skip
    if (run / "summary.json").is_file():
        result["summary"] = json.loads((run / "summary.json").read_text())
    if (run / "metrics.jsonl").is_file():
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        result["validations"] = [r for r in records if r.get("type") == "validation"]
    save()
    chosen = [name.strip() for name in args.evaluations.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(EVALUATIONS))
    if unknown:
        raise SystemExit(f"--evaluations: unknown {unknown}; choose from {list(EVALUATIONS)}")
    result["evaluations"] = {}
    for name in chosen:
        flags = EVALUATIONS[name]
        folder = args.logs / f"eval-{name}"
        steps[f"evaluate_{name}"] = run_step(
            f"evaluate_{name}", [*cli(), "evaluate", "--model", str(best), *flags, "--output", str(folder)], args.logs
        )
        result["evaluations"][name] = evaluation(folder)
        save()
    predictions = args.logs / "predictions.jsonl"
    steps["predict_bf16"] = run_step(
        "predict_bf16",
        [*cli(), "predict", "--model", str(best), "--input", str(PREDICT_INPUT), "--output", str(predictions),
         "--precision", "bf16", "--force"],
        args.logs,
    )  # fmt: skip
    result["prediction"] = prediction_speed(PREDICT_INPUT, predictions, steps["predict_bf16"]["seconds"])
    save()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
