"""The speed tables of the docs (``doc_tables.TABLES``): trunk blocks, against spaCy, the PLE block, prediction,
scale-out and the gate table."""

from __future__ import annotations

from doc_cells import Table, cpu, throughput
from doc_sources import DASH, fmt, load, lookup


def blocks_table() -> Table:
    """docs/pretrained.md: quality and speed against the number of SmolLM2 blocks kept, fp32 and int8."""
    header = [
        "SmolLM2 blocks",
        "words per CPU-second, fp32 / int8",
        "CoNLL test F1, fp32 / int8",
        "SST-2 test acc, fp32 / int8",
        "CPU",
    ]
    names = {
        "24, blocks 8/16/24 mixed": "smollm2_default_ple/best",
        "16": "smollm2_frozen_ple/best",
        "8": "smollm2_blocks8_ple/best",
        "4": "smollm2_b4_ple/best",
    }
    rows = []
    for blocks, name in names.items():  # every row a trained model: speed and quality of the same weights
        a, b = throughput(f"{name} fp32"), throughput(f"{name} int8")
        conll = f"{fmt(a['conll2003_test_f1'])} / {fmt(b['conll2003_test_f1'])}"
        sst2 = f"{fmt(a['sst2_test_accuracy'])} / {fmt(b['sst2_test_accuracy'])}"
        rows.append(
            [
                blocks,
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
