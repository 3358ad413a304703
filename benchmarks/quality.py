"""Real-data quality: train and evaluate the benchmark models on the full data in ../shared/data.

    python benchmarks/quality.py                       # everything (several hours on a 2-core CPU)
    python benchmarks/quality.py --models ple,mlp      # some of them
    python benchmarks/quality.py --table               # print the table of what benchmarks/results holds

Each model trains in its own process under the same wall-clock cap (training.max_minutes, default 20),
selects its checkpoint on validation only, and is then evaluated on validation and test with the same code
as `mtl-decoder evaluate`. Results go to benchmarks/results/quality.json (merged with earlier runs) and a
markdown table is printed: per-task metrics, training time, tokens/s, parameters, peak memory and the mean
of the primary test metrics.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "configs" / "bench"

# name -> (config file, overrides, what it is)
MODELS: dict[str, tuple[str, list[str], str]] = {
    "ple": ("ple.yaml", [], "PLE, the default (CoNLL + SST-2)"),
    "cgc": ("ple.yaml", ["model.ffn=cgc"], "CGC block in every layer"),
    "mmoe": ("ple.yaml", ["model.ffn=mmoe", "model.n_shared_experts=3"], "MMoE: shared experts, per-task gates"),
    "mlp": ("ple.yaml", ["model.ffn=mlp"], "hard sharing: one SwiGLU MLP"),
    "single_conll2003": ("single_conll2003.yaml", [], "the PLE trunk, CoNLL only"),
    "single_sst2": ("single_sst2.yaml", [], "the PLE trunk, SST-2 only"),
    "semeval_ple": ("semeval_ple.yaml", [], "PLE on SemEval-14 aspects + polarity (one example, two labels)"),
    "semeval_single_aspect": ("semeval_single_aspect.yaml", [], "the PLE trunk, SemEval aspects only"),
    "semeval_single_polarity": ("semeval_single_polarity.yaml", [], "the PLE trunk, SemEval polarity only"),
    # ablations of the default (not run by default): what each choice buys
    "ple_causal": ("ple.yaml", ["model.attention=causal"], "PLE with causal (decoder) attention"),
    "ple_softmax": ("ple.yaml", ["model.tagging_decoder=softmax"], "PLE, per-token softmax instead of the CRF"),
    "ple_subwords_only": (
        "ple.yaml",
        ["model.char_embedding=0", "model.word_features=false", "model.word_hash_buckets=0"],
        "PLE on sub-words only (no word features)",
    ),
    "ple_equal": ("ple.yaml", ["balancing.method=equal"], "PLE with equal loss weights instead of EMA"),
}
DEFAULT = [
    "ple",
    "cgc",
    "mmoe",
    "mlp",
    "single_conll2003",
    "single_sst2",
    "semeval_ple",
    "semeval_single_aspect",
    "semeval_single_polarity",
]
TASK_FILES = {  # task name -> data folder under --data-root
    "conll2003": "conll2003",
    "sst2": "sst2",
    "semeval14_aspect": "semeval14_restaurants",
    "semeval14_polarity": "semeval14_restaurants",
}


def carve_semeval(data_root: Path, out_dir: Path, fraction: float = 0.1, seed: int = 0) -> tuple[Path, Path]:
    """SemEval-14 has no validation split: hold out ``fraction`` of train with a fixed seed."""
    lines = [line for line in (data_root / "semeval14_restaurants" / "train.jsonl").read_text().splitlines() if line]
    order = list(range(len(lines)))
    random.Random(seed).shuffle(order)
    held = set(order[: round(fraction * len(lines))])
    out_dir.mkdir(parents=True, exist_ok=True)
    train, val = out_dir / "semeval_train.jsonl", out_dir / "semeval_validation.jsonl"
    train.write_text("".join(lines[i] + "\n" for i in range(len(lines)) if i not in held))
    val.write_text("".join(lines[i] + "\n" for i in range(len(lines)) if i in held))
    return train, val


def data_overrides(config: Path, data_root: Path, carved: tuple[Path, Path]) -> list[str]:
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


def train_one(name: str, args: argparse.Namespace, carved: tuple[Path, Path]) -> dict:
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
    resume = (run_dir / "checkpoints").is_dir() and not (run_dir / "summary.json").is_file()
    if (run_dir / "config.yaml").is_file() and not resume:
        raise SystemExit(f"{run_dir} holds a finished run: remove it to train {name} again")
    log = (args.runs_dir / f"{name}.log").open("a")
    print(f"[{name}] training -> {run_dir} (log: {log.name})", flush=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*cmd, *(["--resume"] if resume else []), *overrides], stdout=log, stderr=subprocess.STDOUT, cwd=REPO
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"[{name}] training failed (exit {proc.returncode}); see {log.name}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "description": MODELS[name][2],
        "overrides": variant,
        "config": str(config.relative_to(REPO)),
        "train_minutes": summary["wall_time_s"] / 60,
        "process_minutes": (time.perf_counter() - started) / 60,
        "steps": summary["steps"],
        "best_step": summary["best_step"],
        "stop_reason": summary["stop_reason"],
        "tokens_per_s": summary["tokens_per_s"],
        "parameters": summary["parameters"],
        "peak_memory_mb": usage.ru_maxrss / 1024,
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


CONLL_SST2_COLUMNS = [  # (title, (split, task, metric))
    ("CoNLL val F1", ("validation", "conll2003", "f1")),
    ("CoNLL test F1", ("test", "conll2003", "f1")),
    ("CoNLL test F1 (strict)", ("test", "conll2003", "f1_strict")),
    ("SST-2 val acc", ("validation", "sst2", "accuracy")),
    ("SST-2 val macro-F1", ("validation", "sst2", "macro_f1")),
    ("SST-2 test acc", ("test", "sst2", "accuracy")),
    ("SST-2 test macro-F1", ("test", "sst2", "macro_f1")),
]
SEMEVAL_COLUMNS = [
    ("aspect test F1", ("test", "semeval14_aspect", "f1")),
    ("aspect test F1 (strict)", ("test", "semeval14_aspect", "f1_strict")),
    ("polarity test acc", ("test", "semeval14_polarity", "accuracy")),
    ("polarity test macro-F1", ("test", "semeval14_polarity", "macro_f1")),
]
SINGLE_PAIRS = {  # the row that compares with a multi-task model: its single-task models side by side
    "single_conll2003 + single_sst2": ("single_conll2003", "single_sst2"),
    "semeval_single_aspect + semeval_single_polarity": ("semeval_single_aspect", "semeval_single_polarity"),
}


def single_pairs(results: dict) -> dict:
    """One combined row per pair of finished single-task runs: each task's metrics from its own model."""
    rows = {}
    for row, (a, b) in SINGLE_PAIRS.items():
        if a in results and b in results:
            first, second = results[a]["metrics"], results[b]["metrics"]
            metrics = {split: {**first[split], **second[split]} for split in ("validation", "test")}
            rows[row] = {
                "metrics": metrics,
                "train_minutes": results[a]["train_minutes"] + results[b]["train_minutes"],
                "parameters": results[a]["parameters"] + results[b]["parameters"],
            }
    return rows


PRIMARY = {"conll2003": "f1", "sst2": "accuracy", "semeval14_aspect": "f1", "semeval14_polarity": "accuracy"}


def table(results: dict) -> str:
    """Markdown table of the CoNLL/SST-2 models, then the SemEval ones."""

    def cell(run: dict, split: str, task: str, key: str) -> str:
        value = run.get("metrics", {}).get(split, {}).get(task, {}).get(key)
        return f"{value:.3f}" if value is not None else "–"

    def mean_primary(run: dict, tasks: tuple[str, ...]) -> str:
        values = [run["metrics"]["test"][t][PRIMARY[t]] for t in tasks if t in run.get("metrics", {}).get("test", {})]
        return f"{sum(values) / len(values):.3f}" if values else "–"

    def common(run: dict) -> list[str]:
        if "tokens_per_s" not in run:  # a pair of single-task models: total time and parameters only
            return [f"{run['train_minutes']:.1f}", "–", f"{run['parameters'] / 1e6:.1f}M", "–"]
        return [
            f"{run['train_minutes']:.1f}",
            f"{run['tokens_per_s']:,.0f}",
            f"{run['parameters'] / 1e6:.1f}M",
            f"{run['peak_memory_mb'] / 1024:.1f} GB",
        ]

    def block(names: list[str], columns: list[tuple[str, tuple[str, str, str]]], tasks: tuple[str, ...]) -> list[str]:
        head = ["model", *(title for title, _ in columns), "train min", "tokens/s", "params", "peak mem"]
        lines = ["| " + " | ".join([*head, "mean primary (test)"]) + " |", "|" + " --- |" * (len(head) + 1)]
        for name in names:
            run = results[name]
            cells = [name, *(cell(run, *key) for _, key in columns), *common(run), mean_primary(run, tasks)]
            lines.append("| " + " | ".join(cells) + " |")
        return lines

    pairs = single_pairs(results)
    order = []  # the models in MODELS order, each pair of single-task models followed by its combined row
    for name in [n for n in MODELS if n in results]:
        order += [name, *[row for row, (_, last) in SINGLE_PAIRS.items() if last == name and row in pairs]]
    results = {**results, **pairs}
    lines = block([n for n in order if not n.startswith("semeval")], CONLL_SST2_COLUMNS, ("conll2003", "sst2"))
    semeval = [n for n in order if n.startswith("semeval")]
    if semeval:
        lines += ["", *block(semeval, SEMEVAL_COLUMNS, ("semeval14_aspect", "semeval14_polarity"))]
    return "\n".join(lines)


def machine() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}",
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "commit": commit.strip(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--runs-dir", type=Path, default=REPO / "benchmarks" / "runs")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results" / "quality.json")
    parser.add_argument("--minutes", type=float, default=20.0, help="training wall-clock cap per model")
    parser.add_argument("--override", action="append", default=[], help="extra key=value for every model")
    parser.add_argument("--table", action="store_true", help="only print the table of the saved results")
    args = parser.parse_args()
    results = json.loads(args.results.read_text()) if args.results.is_file() else {"runs": {}}
    if not args.table:
        args.runs_dir.mkdir(parents=True, exist_ok=True)
        carved = carve_semeval(args.data_root, args.runs_dir / "data")
        for name in args.models.split(","):
            if name not in MODELS:
                raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
            run = train_one(name, args, carved)
            run["metrics"] = evaluate_one(name, args)
            run.update(machine())
            results["runs"][name] = run
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps(results, indent=2))
            print(f"[{name}] done in {run['train_minutes']:.1f} min", flush=True)
    print(table(results["runs"]))


if __name__ == "__main__":
    main()
