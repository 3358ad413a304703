"""The results tables of README.md and docs/, each rendered from benchmarks/results/*.json.

A doc holds a table between ``<!-- table: NAME -->`` and ``<!-- /table -->``; ``TABLES[NAME]`` renders it, and
``python benchmarks/doc_check.py --write`` puts the rendering in place (a new ``distill_*`` run in quality.json needs
nothing else). ``tests/test_docs.py`` fails when a doc's table differs from its rendering.
"""

from __future__ import annotations

from collections.abc import Callable

# The tables live in doc_tables_quality.py and doc_tables_speed.py, their rows in doc_rows.py, their cells in
# doc_cells.py; the names stay importable from here (doc_check.py imports TABLES and render).
from doc_cells import (  # noqa: F401
    CONLL_SST2,
    SEMEVAL,
    Table,
    cpu,
    distill_runs,
    mean_test,
    metric,
    peer,
    render,
    run,
    throughput,
)
from doc_rows import (
    PRETRAINED,
    PRETRAINED_ABLATIONS,
    PRETRAINED_DEFAULT,
    PRETRAINED_READS,
    PRETRAINED_READS_SEMEVAL,
    PRETRAINED_TOP,
    PRETRAINED_TOP_SEMEVAL,
    RERUN,
    SCRATCH,
)
from doc_tables_quality import (
    distill_states_table,
    distill_table,
    peers_table,
    quality_table,
    semeval_names,
    summary_table,
)
from doc_tables_speed import blocks_table, gate_table, ple_block_table, predict_table, scale_table, speed_table

TABLES: dict[str, Callable[[], Table]] = {
    "summary": summary_table,
    "distill": distill_table,
    "distill_states": distill_states_table,
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
    "pretrained_default": lambda: quality_table(
        "quality.json", PRETRAINED_DEFAULT, CONLL_SST2, ["CoNLL F1", "SST-2 acc"], gap=True
    ),
    "pretrained_reads": lambda: quality_table(
        "quality.json", PRETRAINED_READS, CONLL_SST2, ["CoNLL F1", "SST-2 acc"], gap=True
    ),
    "pretrained_top": lambda: quality_table(
        "quality.json", PRETRAINED_TOP, CONLL_SST2, ["CoNLL F1", "SST-2 acc"], gap=True
    ),
    "pretrained_reads_semeval": lambda: quality_table(
        "quality.json", PRETRAINED_READS_SEMEVAL, SEMEVAL, ["aspect F1", "polarity acc"]
    ),
    "pretrained_top_semeval": lambda: quality_table(
        "quality.json", PRETRAINED_TOP_SEMEVAL, SEMEVAL, ["aspect F1", "polarity acc"]
    ),
    "pretrained_default_semeval": lambda: quality_table(
        "quality.json", semeval_names("smollm2_default_"), SEMEVAL, ["aspect F1", "polarity acc"]
    ),
    "pretrained_ablations": lambda: quality_table(
        "quality.json", PRETRAINED_ABLATIONS, (("conll2003", "f1"),), ["CoNLL F1"], gap=True
    ),
}
