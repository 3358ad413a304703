"""The markdown table ``quality.py --table`` prints from benchmarks/results: every run's metrics, the single-task
pairs side by side, footnotes for runs resumed, capped or that computed the trunk's states, the machines."""

from __future__ import annotations

import math

from distill_rows import distill_table
from quality_models import MODELS
from smollm2_rows import PAIRS as SMOLLM2_PAIRS

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
