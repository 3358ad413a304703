"""The gate table against the exact model: latency (one sentence at a time, and batched) and every task's metric,
as a curve over skip thresholds (issue 15: the design claims ~30% lower latency at equal metrics).

    python benchmarks/gate_table.py [--model benchmarks/runs/demo_gate/best] [--thresholds 0,0.05,0.1,...]
                                    [--single 200] [--repeats 2] [--threads 1] [--json]

Model: the demo config trained briefly on the bundled samples; the script trains it when it is missing (CPU minutes):

    mtl-decoder train --config configs/demo.yaml --output-dir benchmarks/runs/demo_gate training.max_steps=600

Table: ``build-gate-table`` from the model's training sample (the NER and SST-2 train files, 4,000 records),
--buckets buckets (default 16). Metrics: the test split of both tasks (NER entity F1, sentiment accuracy), scored as
``evaluate`` scores them. Latency: ``single``: the first --single test sentences predicted one at a time (batch of
one, like an interactive caller), the median per sentence; ``batched``: all 1,000 test sentences through the
Predictor in batches of 64, the total. Each setting is timed --repeats times, alternating with the exact model
so that both see the same load (the machine may be shared), and the best run of each is kept. Rows: ``exact``;
then per threshold the table with its default edge margin (``table``); and ``real gates`` (edge margin 0.5: every
token's gate runs, only the skipping approximates), which separates the two sources of error.

Writes benchmarks/results/gate_table.json. Timings name the CPU; torch runs --threads threads, the Predictor one
worker.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from mtl_decoder.data.tasks import load_split
from mtl_decoder.evaluation.scoring import score_sources
from mtl_decoder.inference import Predictor
from mtl_decoder.inference.gate_apply import apply_gate_table, remove_gate_table
from mtl_decoder.inference.gate_build import build_gate_table
from mtl_decoder.inference.gate_table import GateTable
from mtl_decoder.saved import load_model

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "benchmarks" / "runs" / "demo_gate"
RESULTS = REPO / "benchmarks" / "results" / "gate_table.json"


def cpu() -> dict:
    model, flags = "unknown", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and model == "unknown":
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    return {"cpu": model, "cores": torch.get_num_threads(), "avx512": bool(avx512), "avx2": "avx2" in flags}


def ensure_model(model: Path) -> Path:
    if (model / "model.safetensors").is_file():
        return model
    if model != RUN / "best":
        raise SystemExit(f"{model}: no model there")
    print("training the demo model for 600 steps (benchmarks/runs/demo_gate) ...", file=sys.stderr)
    subprocess.run(
        [sys.executable, "-m", "mtl_decoder", "train", "--config", str(REPO / "configs" / "demo.yaml"),
         "--output-dir", str(RUN), "training.max_steps=600", "training.progress=false"],
        check=True,
    )  # fmt: skip
    return model


def metrics(predictor: Predictor, sources, task_cfgs, label_sets) -> dict[str, float]:
    scored = score_sources(predictor, sources, task_cfgs, label_sets)
    return {name: scored[name][task_cfgs[name].primary_metric] for name in scored}


def time_single(predictor: Predictor, items: list) -> float:
    """Median seconds per sentence, one sentence per call."""
    times = []
    for item in items:
        start = time.perf_counter()
        list(predictor.predict([item]))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_batched(predictor: Predictor, items: list) -> float:
    start = time.perf_counter()
    list(predictor.predict(items))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=RUN / "best")
    parser.add_argument("--thresholds", default="0,0.05,0.1,0.2,0.3")
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--single", type=int, default=200, help="sentences timed one at a time")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    saved = load_model(ensure_model(args.model))
    cfg = saved.config
    names = list(cfg.tasks)

    train_sources = load_split(dict(cfg.tasks), "train", names)
    sample = [ex.words if ex.words is not None else ex.text for s in train_sources for ex in s.examples]
    started = time.perf_counter()
    table = build_gate_table(saved, sample, buckets=args.buckets, sample={"input": "train splits of the demo"})
    build_seconds = time.perf_counter() - started
    table_path = args.model.parent / "gate_table"
    table.save(table_path)
    table = GateTable.load(table_path)

    test_sources = load_split(dict(cfg.tasks), "test", names)
    test_items = [ex.words if ex.words is not None else ex.text for s in test_sources for ex in s.examples]
    single_items = test_items[:: max(1, len(test_items) // args.single)][: args.single]
    single = Predictor.from_saved(saved, batch_size=1, workers=1)
    batched = Predictor.from_saved(saved, batch_size=64, workers=1)

    settings = [("exact", None, None)]
    settings += [("table", float(t), table.edge_margin) for t in args.thresholds.split(",")]
    settings += [("real gates", float(t), 0.5) for t in args.thresholds.split(",") if float(t) > 0]

    rows = []
    for kind, threshold, margin in settings:
        remove_gate_table(saved)
        stats = None
        if kind != "exact":
            stats = apply_gate_table(saved, table, threshold=threshold, edge_margin=margin)
        scores = metrics(batched, test_sources, dict(cfg.tasks), saved.label_sets)
        gate_stats = stats.to_dict() if stats is not None else None
        times: dict[str, list[float]] = {"single": [], "batched": []}
        exact_times: dict[str, list[float]] = {"single": [], "batched": []}
        for _ in range(args.repeats):  # alternate with the exact model: both see the same load
            if kind != "exact":
                remove_gate_table(saved)
                exact_times["single"].append(time_single(single, single_items))
                exact_times["batched"].append(time_batched(batched, test_items))
                apply_gate_table(saved, table, threshold=threshold, edge_margin=margin)
            times["single"].append(time_single(single, single_items))
            times["batched"].append(time_batched(batched, test_items))
        if kind == "exact":
            exact_times = times
        rows.append(
            {
                "setting": kind,
                "threshold": threshold,
                "edge_margin": margin,
                "metrics": scores,
                "single_ms": 1000 * min(times["single"]),
                "batched_s": min(times["batched"]),
                "exact_single_ms": 1000 * min(exact_times["single"]),
                "exact_batched_s": min(exact_times["batched"]),
                "gate_stats": gate_stats,
            }
        )
        print(_line(rows[-1], rows[0]), file=sys.stderr)
    remove_gate_table(saved)
    result = {
        "model": str(args.model),
        "machine": {**cpu(), "threads": args.threads, "torch": torch.__version__, "python": platform.python_version()},
        "buckets": args.buckets,
        "build_seconds": build_seconds,
        "sample_records": table.sample.get("records"),
        "test_sentences": len(test_items),
        "single_sentences": len(single_items),
        "repeats": args.repeats,
        "rows": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(report(result))


def _line(row: dict, exact: dict) -> str:
    m = ", ".join(f"{k} {v:.4f}" for k, v in row["metrics"].items())
    skipped = row["gate_stats"]["skipped_share"] if row["gate_stats"] else 0.0
    return (
        f"{row['setting']:<10} t={row['threshold']}: {m}; single {row['single_ms']:.2f} ms "
        f"(exact {row['exact_single_ms']:.2f}), batched {row['batched_s']:.2f} s (exact {row['exact_batched_s']:.2f}); "
        f"skipped {skipped:.1%}"
    )


def report(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"{m['cpu']} ({'AVX-512' if m['avx512'] else 'no AVX-512'}), torch {m['torch']}, {m['threads']} thread(s); "
        f"{result['test_sentences']} test sentences, {result['single_sentences']} timed one at a time",
        "",
        "| setting | threshold | "
        + " | ".join(result["rows"][0]["metrics"])
        + " | expert rows skipped | real gates run "
        "| single (ms) | vs exact | batched (s) | vs exact |",
        "| --- | --- | "
        + " | ".join("---" for _ in result["rows"][0]["metrics"])
        + " | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        stats = row["gate_stats"] or {"skipped_share": 0.0, "full_gate_share": 1.0}
        single = row["single_ms"] / row["exact_single_ms"] - 1
        batch = row["batched_s"] / row["exact_batched_s"] - 1
        lines.append(
            f"| {row['setting']} | {'-' if row['threshold'] is None else row['threshold']} | "
            + " | ".join(f"{v:.4f}" for v in row["metrics"].values())
            + f" | {stats['skipped_share']:.1%} | {stats['full_gate_share']:.1%} | {row['single_ms']:.2f} | "
            f"{single:+.1%} | {row['batched_s']:.2f} | {batch:+.1%} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
