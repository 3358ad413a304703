"""The results tables of README.md and docs/, each rendered from benchmarks/results/*.json.

A doc holds a table between ``<!-- table: NAME -->`` and ``<!-- /table -->``; ``TABLES[NAME]`` renders it, and
``python benchmarks/doc_check.py --write`` puts the rendering in place (a new ``distill_*`` run in quality.json needs
nothing else). ``tests/test_docs.py`` fails when a doc's table differs from its rendering.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from doc_sources import DASH, fmt, load, lookup


def run(name: str, key: str, file: str = "quality.json") -> Any:
    """A field of one run of a quality result file."""
    return lookup(file, f"runs.{name}.{key}")


def metric(file: str, name: str, split: str, task: str, key: str) -> float | None:
    """A run's metric, None when the run has no such task (a single-task model)."""
    metrics = lookup(file, f"runs.{name}.metrics.{split}")
    return metrics[task][key] if task in metrics else None


def mean_test(file: str, name: str, tasks: tuple[tuple[str, str], ...]) -> float | None:
    values = [metric(file, name, "test", t, k) for t, k in tasks]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def cpu(text: str | None) -> str:
    """A CPU as a table cell: the model name without its family, cores and features."""
    if text is None:
        return DASH
    return re.sub(r"\s*\(family.*", "", text.replace("(R)", "")).split(",")[0].strip()


# ------------------------------------------------------------------------------------------ the tables

Table = tuple[list[str], list[list[str]]]
CONLL_SST2 = (("conll2003", "f1"), ("sst2", "accuracy"))
SEMEVAL = (("semeval14_aspect", "f1"), ("semeval14_polarity", "accuracy"))


def render(table: Table) -> str:
    header, rows = table
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def distill_runs() -> list[str]:
    """The distillation rows quality.json holds, in the order they were added."""
    return [name for name in lookup("quality.json", "runs") if name.startswith("distill_")]


def peer(path: str) -> Any:
    """A value of peers.json's ``peers.PATH``; None while that peer (PATH's first key) has no entry yet, so its cells
    show DASH (a wrong key inside an entry still fails)."""
    name = path.split(".")[0]
    return lookup("peers.json", f"peers.{path}") if name in lookup("peers.json", "peers") else None


def throughput(name: str) -> dict:
    return lookup("pretrained_throughput.json", f"entries[name={name}]")


def summary_table() -> Table:
    """README: the models a user chooses between, with the peers, quality and speed side by side."""
    header = ["model", "CoNLL-2003 test F1", "SST-2 test acc", "words per CPU-second (1 thread)", "speed measured on"]
    spacy_speed = "spacy_throughput.json"
    sixteen = throughput("smollm2 16 blocks untrained fp32")
    best = lookup("pretrained_throughput.json", "best")
    rows = [
        [
            "`ple` on the frozen SmolLM2-135M trunk, 16 blocks, fp32 (speed: the same shape, untrained)",
            fmt(metric("quality.json", "smollm2_frozen_ple", "test", "conll2003", "f1")),
            fmt(metric("quality.json", "smollm2_frozen_ple", "test", "sst2", "accuracy")),
            fmt(sixteen["words_per_cpu_s"], 0),
            cpu(sixteen["cpu"]),
        ],
        [
            f"`ple` on the frozen SmolLM2-135M trunk, {best['blocks']} blocks, `--precision {best['precision']}`",
            fmt(best["conll2003_test_f1"]),
            fmt(best["sst2_test_accuracy"]),
            fmt(best["words_per_cpu_s"], 0),
            cpu(best["cpu"]),
        ],
    ]
    for name in distill_runs():
        rows.append(
            [
                f"`{name}` (distilled student)",
                fmt(metric("quality.json", name, "test", "conll2003", "f1")),
                fmt(metric("quality.json", name, "test", "sst2", "accuracy")),
                fmt(run(name, "words_per_cpu_s"), 0),
                cpu(run(name, "cpu")),
            ]
        )
    rows += [
        [
            "`ple` from scratch (`configs/bench/ple.yaml`)",
            fmt(metric("quality_rerun.json", "ple", "test", "conll2003", "f1")),
            fmt(metric("quality_rerun.json", "ple", "test", "sst2", "accuracy")),
            fmt(lookup(spacy_speed, "summary.ours_1_thread.words_per_cpu_s"), 0),
            cpu(lookup(spacy_speed, "cpu")),
        ],
        [
            "peer: spaCy 3.8 CNN pipeline (ner + textcat)",
            fmt(peer("spacy.conll2003.test_f1")),
            fmt(peer("spacy.sst2.test_accuracy")),
            fmt(lookup(spacy_speed, "summary.spacy_1_process.words_per_cpu_s"), 0),
            cpu(lookup(spacy_speed, "cpu")),
        ],
        ["peer: feature CRF", fmt(peer("crf.conll2003.test_f1")), DASH, DASH, DASH],
        ["peer: TF-IDF + logistic regression", DASH, fmt(peer("tfidf_lr.sst2.test_accuracy")), DASH, DASH],
    ]
    return header, rows


def distill_table() -> Table:
    """docs/distillation.md: every distillation row of quality.json with its teacher's settings."""
    header = [
        "run",
        "CoNLL test F1",
        "SST-2 test acc",
        "words per CPU-second",
        "transfer texts",
        "soft",
        "T",
        "alpha",
        "teacher minutes",
        "CPU",
    ]
    rows = []
    for name in distill_runs():
        r = lookup("quality.json", f"runs.{name}")
        rows.append(
            [
                f"`{name}`",
                fmt(metric("quality.json", name, "test", "conll2003", "f1")),
                fmt(metric("quality.json", name, "test", "sst2", "accuracy")),
                fmt(r["words_per_cpu_s"], 0),
                fmt(r["transfer_texts"], 0),
                "yes" if r["soft"] else "no (hard labels)",
                fmt(r["temperature"], 1),
                fmt(r["alpha"], 2),
                fmt(r["teacher_minutes"], 1),
                cpu(r["cpu"]),
            ]
        )
    return header, rows


def quality_table(
    file: str, names: list[str], tasks: tuple[tuple[str, str], ...], labels: list[str], gap: bool = False
) -> Table:
    """Validation and test of each task's primary metric, the test mean, minutes, parameters, peak memory."""
    header = ["model"]
    for label in labels:
        header += [f"{label} val", f"{label} test"]
    header += ["mean primary (test)"]
    if gap:
        header += ["CoNLL val − test (points)"]
    header += ["train min", "params", "peak mem (GiB)", "CPU"]
    rows = []
    for name in names:
        r = lookup(file, f"runs.{name}")
        row = [f"`{name}`" + ("†" if r.get("resumed") else "")]
        for task, key in tasks:
            row += [fmt(metric(file, name, "validation", task, key)), fmt(metric(file, name, "test", task, key))]
        row.append(fmt(mean_test(file, name, tasks)))
        if gap:
            val, test = (metric(file, name, s, "conll2003", "f1") for s in ("validation", "test"))
            row.append(DASH if val is None else fmt(100 * (val - test), 1))
        row += [
            fmt(r["train_minutes"], 1),
            f"{r['parameters'] / 1e6:.1f}M",
            fmt(r["peak_memory_mb"] / 1024, 1),
            cpu(r["cpu"]),
        ]
        rows.append(row)
    return header, rows


SCRATCH = [
    "ple",
    "cgc",
    "mmoe",
    "mlp",
    "single_conll2003",
    "single_sst2",
    "ple_causal",
    "ple_softmax",
    "ple_subwords_only",
    "ple_equal",
]
RERUN = ["ple", "cgc", "mmoe", "mlp", "single_conll2003", "single_sst2", "ple_linear_pos"]
PRETRAINED = [
    "smollm2_frozen_ple",
    "smollm2_single_conll2003",
    "smollm2_single_sst2",
    "smollm2_b8_ple",
    "smollm2_b4_ple",
]
PRETRAINED_ABLATIONS = [
    "smollm2_conll_first_causal",
    "smollm2_conll_last_causal",
    "smollm2_conll_first_bidirectional",
    "smollm2_conll_last_bidirectional",
    "smollm2_conll_no_hashed_words",
    "smollm2_conll_trunk_only",
    "smollm2_single_conll2003_trunk_only",
]


def peers_table() -> Table:
    """docs/benchmarks.md: the peers of peers.json on every task they were scored on."""
    header = [
        "peer",
        "CoNLL-2003 val / test F1",
        "SST-2 val / test acc",
        "SemEval aspect test F1",
        "SemEval polarity test acc (macro-F1)",
        "train CPU-seconds (CoNLL-2003 / SST-2)",
        "CPU",
    ]

    def pair(a: str, b: str) -> str:
        return f"{fmt(peer(a))} / {fmt(peer(b))}"

    rows = [
        [
            "feature CRF",
            pair("crf.conll2003.validation_f1", "crf.conll2003.test_f1"),
            DASH,
            fmt(peer("crf.semeval14_aspect.test_f1")),
            DASH,
            f"{fmt(peer('crf.conll2003.train_cpu_s'), 0)} / {DASH}",
            cpu(peer("crf.run.cpu")),
        ],
        [
            "TF-IDF + logistic regression",
            DASH,
            pair("tfidf_lr.sst2.validation_accuracy", "tfidf_lr.sst2.test_accuracy"),
            DASH,
            f"{fmt(peer('tfidf_lr.semeval14_polarity.test_accuracy'))} "
            f"({fmt(peer('tfidf_lr.semeval14_polarity.test_macro_f1'))})",
            f"{DASH} / {fmt(peer('tfidf_lr.sst2.train_cpu_s'), 0)}",
            cpu(peer("tfidf_lr.run.cpu")),
        ],
        [
            "spaCy 3.8 CNN pipeline",
            pair("spacy.conll2003.validation_f1", "spacy.conll2003.test_f1"),
            pair("spacy.sst2.validation_accuracy", "spacy.sst2.test_accuracy"),
            DASH,
            DASH,
            DASH
            if peer("spacy.train_cpu_s") is None
            else f"{fmt(peer('spacy.train_cpu_s'), 0)} (both tasks, one pipeline)",
            cpu(peer("spacy.run.cpu")),
        ],
    ]
    return header, rows


def blocks_table() -> Table:
    """docs/pretrained.md: quality and speed against the number of SmolLM2 blocks kept, fp32 and int8."""
    header = [
        "SmolLM2 blocks",
        "words per CPU-second, fp32 / int8",
        "CoNLL test F1, fp32 / int8",
        "SST-2 test acc, fp32 / int8",
        "CPU",
    ]
    names = {16: "smollm2 16 blocks untrained", 8: "smollm2_blocks8_ple/best", 4: "smollm2_b4_ple/best"}
    rows = []
    for blocks, name in names.items():
        a, b = throughput(f"{name} fp32"), throughput(f"{name} int8")
        if blocks == 16:  # the speed of an untrained model of the trained one's shape; quality from quality.json
            conll = f"{fmt(metric('quality.json', 'smollm2_frozen_ple', 'test', 'conll2003', 'f1'))} / {DASH}"
            sst2 = f"{fmt(metric('quality.json', 'smollm2_frozen_ple', 'test', 'sst2', 'accuracy'))} / {DASH}"
        else:
            conll = f"{fmt(a['conll2003_test_f1'])} / {fmt(b['conll2003_test_f1'])}"
            sst2 = f"{fmt(a['sst2_test_accuracy'])} / {fmt(b['sst2_test_accuracy'])}"
        rows.append(
            [
                str(blocks),
                f"{fmt(a['words_per_cpu_s'], 1)} / {fmt(b['words_per_cpu_s'], 1)}",
                conll,
                sst2,
                cpu(a["cpu"]),
            ]
        )
    return header, rows


def speed_table() -> Table:
    """docs/benchmarks.md: words per CPU-second against spaCy, one thread, alternating in one run."""
    f = "spacy_throughput.json"
    header = ["system (1 thread)", "words per CPU-second", "MFLOP per word", "CPU"]
    rows = [
        [
            "ours, `configs/bench/ple.yaml`, fp32",
            fmt(lookup(f, "summary.ours_1_thread.words_per_cpu_s"), 0),
            fmt(lookup(f, "ours.mflop_per_word"), 1),
            cpu(lookup(f, "cpu")),
        ],
        [
            "spaCy 3.8, CNN width 96, depth 4 (the peer)",
            fmt(lookup(f, "summary.spacy_1_process.words_per_cpu_s"), 0),
            fmt(lookup(f, "spacy.mflop_per_word_estimate"), 2),
            cpu(lookup(f, "cpu")),
        ],
        [
            "spaCy 3.8, CNN width 256, depth 8",
            fmt(lookup(f, "spacy_wide_cnn.summary.spacy_1_process.words_per_cpu_s"), 0),
            fmt(lookup(f, "spacy_wide_cnn.spacy.mflop_per_word_estimate"), 1),
            cpu(lookup(f, "cpu")),
        ],
    ]
    for m in lookup(f, "size_variants.models")[1:]:
        rows.append(
            [
                f"ours, {m['model']} (untrained, speed only)",
                fmt(m["words_per_cpu_s"], 0),
                fmt(m["mflop_per_word"], 1),
                cpu(lookup(f, "cpu")),
            ]
        )
    return header, rows


def ple_block_table() -> Table:
    """docs/benchmarks.md: one expert layer against the recompute-per-task formulation."""
    header = ["variant", "tasks", "ms / step", "recompute-per-task ms", "speedup", "ideal", "of peak", "CPU"]
    rows = []
    for variant in ("ple", "cgc", "mmoe"):
        for tasks in (2, 4):
            r = load(f"ple_block_{variant}_{tasks}tasks.json")
            rows.append(
                [
                    f"`{variant}`",
                    str(tasks),
                    fmt(r["ms_per_step"], 0),
                    fmt(r["recompute_ms_per_step"], 0),
                    f"{fmt(r['speedup'], 2)}x",
                    f"{fmt(r['ideal_speedup'], 2)}x",
                    fmt(r["fraction_of_peak"], 2),
                    r["cpu"],
                ]
            )
    return header, rows


def predict_table() -> Table:
    """docs/benchmarks.md: predict against a one-sentence-at-a-time loop."""
    header = [
        "result file",
        "precision",
        "torch threads",
        "sentences/s",
        "words/s",
        "loop sentences/s",
        "batched / loop",
    ]
    rows = []
    for name in ("predict_throughput.json", "predict_throughput_bf16.json", "predict_throughput_1thread.json"):
        r = load(name)
        rows.append(
            [
                f"`{name}`",
                r["precision"],
                str(r["torch_threads"]),
                fmt(r["sentences_per_s"], 0),
                fmt(r["tokens_per_s"], 0),
                fmt(r["naive_sentences_per_s"], 0),
                f"{fmt(r['batched_over_naive'], 2)}x",
            ]
        )
    return header, rows


def scale_table() -> Table:
    """docs/scale-out.md: one process against two, the whole command each."""
    r = load("predict_scale.json")
    header = ["way", "predict seconds", "records/s", "whole command seconds"]
    rows = [
        [way, fmt(w["predict_seconds"], 1), fmt(w["records_per_s"], 0), fmt(w["wall_seconds"], 1)]
        for way, w in r["ways"].items()
    ]
    return header, rows


def gate_table() -> Table:
    """docs/diagnostics.md: the gate table's quality and speed against the exact model."""
    r = load("gate_table.json")
    header = [
        "gates",
        "threshold",
        "NER F1",
        "sentiment acc",
        "expert rows skipped",
        "real gates run",
        "one sentence vs exact",
        "batched vs exact",
    ]
    rows = []
    for row in r["rows"]:
        stats = row["gate_stats"]
        exact = row["setting"] == "exact"
        every_token = row["edge_margin"] in (
            "all",
            0.5,
        )  # the file's "all" is --edge-margin 0.5: no token reads the table
        label = row["setting"] + (" (`--edge-margin 0.5`)" if every_token else "")
        rows.append(
            [
                label,
                DASH if exact else fmt(row["threshold"], 2),
                fmt(row["metrics"]["ner"]),
                fmt(row["metrics"]["sentiment"]),
                "0%" if exact else f"{100 * stats['skipped_share']:.0f}%",
                "100%" if exact else f"{100 * stats['full_gate_share']:.0f}%",
                f"{fmt(row['single_ms'], 1)} ms"
                if exact
                else f"{100 * (row['single_ms'] / row['exact_single_ms'] - 1):+.0f}%",
                f"{fmt(row['batched_s'], 2)} s"
                if exact
                else f"{100 * (row['batched_s'] / row['exact_batched_s'] - 1):+.0f}%",
            ]
        )
    return header, rows


def semeval_names(prefix: str) -> list[str]:
    return [f"{prefix}semeval_ple", f"{prefix}semeval_single_aspect", f"{prefix}semeval_single_polarity"]


TABLES: dict[str, Callable[[], Table]] = {
    "summary": summary_table,
    "distill": distill_table,
    "peers": peers_table,
    "blocks": blocks_table,
    "speed": speed_table,
    "ple_block": ple_block_table,
    "predict": predict_table,
    "scale": scale_table,
    "gate_table": gate_table,
    "scratch": lambda: quality_table("quality.json", SCRATCH, CONLL_SST2, ["CoNLL F1", "SST-2 acc"], gap=True),
    "scratch_semeval": lambda: quality_table("quality.json", semeval_names(""), SEMEVAL, ["aspect F1", "polarity acc"]),
    "rerun": lambda: quality_table("quality_rerun.json", RERUN, CONLL_SST2, ["CoNLL F1", "SST-2 acc"], gap=True),
    "rerun_semeval": lambda: quality_table(
        "quality_rerun.json", semeval_names(""), SEMEVAL, ["aspect F1", "polarity acc"]
    ),
    "pretrained": lambda: quality_table("quality.json", PRETRAINED, CONLL_SST2, ["CoNLL F1", "SST-2 acc"], gap=True),
    "pretrained_semeval": lambda: quality_table(
        "quality.json", semeval_names("smollm2_"), SEMEVAL, ["aspect F1", "polarity acc"]
    ),
    "pretrained_ablations": lambda: quality_table(
        "quality.json", PRETRAINED_ABLATIONS, (("conll2003", "f1"),), ["CoNLL F1"], gap=True
    ),
}
