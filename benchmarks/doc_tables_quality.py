"""The quality tables of the docs (``doc_tables.TABLES``): the README's summary, distillation, the peers, and the
validation / test tables of each group of quality runs."""

from __future__ import annotations

from statistics import mean

from doc_cells import Table, cpu, distill_runs, mean_test, metric, peer, run, throughput
from doc_rows import RECIPE_SEEDS
from doc_sources import DASH, fmt, lookup

from mtl_decoder.config.schema import DistillConfig

FEATURED_STUDENTS = {
    "distill_small_states_long_sent": "configs/distill_fast.yaml",
    "distill_small_states_sent_bidirteacher_lex_learned_6pass": "configs/distill_fast_lexicon.yaml",
}
"""quality_states.json's students the README's summary shows: the recipe files' rows, and the files."""
DISTILL_DEFAULTS = (DistillConfig().temperature, DistillConfig().alpha)
"""distill.temperature and distill.alpha's defaults: the README's students are the rows run at them."""


def summary_table() -> Table:
    """README: the models a user chooses between, with the peers, quality and speed side by side."""
    header = ["model", "CoNLL-2003 test F1", "SST-2 test acc", "words per CPU-second (1 thread)", "speed measured on"]
    spacy_speed = "spacy_throughput.json"
    sixteen = throughput("smollm2_frozen_ple/best fp32")
    best = lookup("pretrained_throughput.json", "best")
    hybrid = lookup("pretrained_throughput_hybrid.json", "best")  # its own run of the same script
    rows = [
        [
            "`ple` on the frozen SmolLM2-135M trunk, 16 blocks, fp32 (`configs/bench/smollm2_frozen.yaml`)",
            fmt(sixteen["conll2003_test_f1"]),
            fmt(sixteen["sst2_test_accuracy"]),
            fmt(sixteen["words_per_cpu_s"], 0),
            cpu(sixteen["cpu"]),
        ],
        [
            "`ple` on SmolLM2-135M, 16 blocks cached and 2 more trained, fp32 (`configs/bench/smollm2_hybrid.yaml`)",
            fmt(hybrid["conll2003_test_f1"]),
            fmt(hybrid["sst2_test_accuracy"]),
            fmt(hybrid["words_per_cpu_s"], 0),
            cpu(hybrid["cpu"]),
        ],
        echo_hybrid_row(),
        w8a8_row(),
        hybrid_bidir_w8a8_row(),
        hybrid_short_w8a8_row(),
        [
            f"`ple` on the frozen SmolLM2-135M trunk, {best['blocks']} blocks, `--precision {best['precision']}`",
            fmt(best["conll2003_test_f1"]),
            fmt(best["sst2_test_accuracy"]),
            fmt(best["words_per_cpu_s"], 0),
            cpu(best["cpu"]),
        ],
    ]
    for name in distill_runs():
        if (run(name, "temperature"), run(name, "alpha")) != DISTILL_DEFAULTS:
            continue  # the sweeps of a setting live in docs/distillation.md's table
        rows.append(
            [
                f"`{name}` (distilled student)",
                fmt(metric("quality.json", name, "test", "conll2003", "f1")),
                fmt(metric("quality.json", name, "test", "sst2", "accuracy")),
                fmt(run(name, "words_per_cpu_s"), 0),
                cpu(run(name, "cpu")),
            ]
        )
    states = "quality_states.json"
    for name in (n for n in FEATURED_STUDENTS if n in lookup(states, "runs")):
        seeds = recipe_seeds(states, name)
        label = f"`{name}` (distilled student, `{FEATURED_STUDENTS[name]}`" + (
            f", mean of {len(seeds)} seeds)" if len(seeds) > 1 else ")"
        )
        rows.append(
            [
                label,
                fmt(mean([metric(states, n, "test", "conll2003", "f1") for n in seeds])),
                fmt(mean([metric(states, n, "test", "sst2", "accuracy") for n in seeds])),
                fmt(mean([lookup(states, f"runs.{n}.words_per_cpu_s") for n in seeds]), 0),
                cpu(lookup(states, f"runs.{name}.cpu")),
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


def recipe_seeds(file: str, name: str) -> list[str]:
    """``name`` and its rows at other seeds (``NAME_seedN``) that ``file`` holds: one recipe's runs."""
    runs = lookup(file, "runs")
    return [name, *sorted(n for n in runs if n.startswith(f"{name}_seed") and n[len(name) + 5 :].isdigit())]


def distill_states_table() -> Table:
    """docs/distillation.md: the students of the retrained 16-block teacher (quality_states.json), every one it
    holds, in the order they were added: validation and test, speed, steps, peak memory, and the teacher."""
    file = "quality_states.json"
    header = ["student", "seed", "CoNLL val", "CoNLL test", "SST-2 val", "SST-2 test", "words per CPU-second",
              "steps", "peak mem (GiB)", "teacher"]  # fmt: skip
    rows = []
    for name in (n for n in lookup(file, "runs") if n.startswith("distill_")):
        r = lookup(file, f"runs.{name}")
        seed = next((o.split("=")[1] for o in r["overrides"] if o.startswith("training.seed=")), "0")
        row = [f"`{name}`" + ("†" if r.get("resumed") else ""), seed]
        for task, key in (("conll2003", "f1"), ("sst2", "accuracy")):
            row += [fmt(metric(file, name, "validation", task, key)), fmt(metric(file, name, "test", task, key))]
        teacher = r["teacher"].rstrip("/").split("/")[-2]  # RUN of RUN/best
        row += [fmt(r["words_per_cpu_s"], 0), fmt(r["steps"], 0), fmt(r["peak_memory_mb"] / 1024, 1), f"`{teacher}`"]
        rows.append(row)
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


def semeval_names(prefix: str) -> list[str]:
    return [f"{prefix}semeval_ple", f"{prefix}semeval_single_aspect", f"{prefix}semeval_single_polarity"]


def int8_row(label: str, throughput: str, entry: str, agreement: str) -> list[str]:
    """A summary row of a model in int8: its speed from a pretrained_throughput.py run (``entry``: the entry's name)
    and its int8 test quality from its precision_agreement.py run."""
    speed = lookup(throughput, f"entries[name={entry}]")
    return [
        label,
        fmt(lookup(agreement, "int8.test.conll2003.conll2003_test_f1")),
        fmt(lookup(agreement, "int8.test.sst2.sst2_test_accuracy")),
        fmt(speed["words_per_cpu_s"], 0),
        cpu(speed["cpu"]),
    ]


def echo_hybrid_row() -> list[str]:
    """configs/bench/smollm2_echo_hybrid.yaml: the mean of its seeds' test scores; its speed timed on the 3,000-step
    run's seed 0, the same network (the schedule changes the weights, not the work per word)."""
    speed = lookup(
        "pretrained_throughput_echo_hybrid_3k.json", "entries[name=smollm2_echo_hybrid2_on16_bidir_3k_ple/best fp32]"
    )
    seeds = [f"smollm2_echo_hybrid2_on16_bidir_full{s}_ple" for s in RECIPE_SEEDS]
    return [
        "`ple` on SmolLM2-135M, 16 blocks cached reading each text twice and 2 more trained with the causal mask "
        f"lifted, fp32 (`configs/bench/smollm2_echo_hybrid.yaml`, mean of {len(seeds)} seeds)",
        fmt(mean(metric("quality.json", n, "test", "conll2003", "f1") for n in seeds)),
        fmt(mean(metric("quality.json", n, "test", "sst2", "accuracy") for n in seeds)),
        fmt(speed["words_per_cpu_s"], 0),
        cpu(speed["cpu"]),
    ]


def hybrid_bidir_w8a8_row() -> list[str]:
    """The hybrid with its trained blocks bidirectional, W8A8 after quantize (its top blocks float32: the code before
    smoothquant_top.py)."""
    return int8_row(
        "`ple` on SmolLM2-135M, 16 blocks cached (W8A8 `--precision int8`) and 2 more trained (float32) with the "
        "causal mask lifted (`model.trunk.top_attention=bidirectional`)",
        "pretrained_throughput_hybrid_bidir.json",
        "smollm2_hybrid2_on16_bidir_ple/best int8",
        "precision_agreement_hybrid_bidir_w8a8.json",
    )


def hybrid_short_w8a8_row() -> list[str]:
    """The bidirectional hybrid on a 1,500-step schedule, W8A8 after ``quantize --per-token all`` with its trained
    blocks int8 too (smoothquant_top.py)."""
    return int8_row(
        "`ple` on SmolLM2-135M, 16 blocks cached and 2 more trained with the causal mask lifted, 1,500 steps, all 18 "
        "in W8A8 (`quantize --per-token all`, `--precision int8`)",
        "pretrained_throughput_hybrid_short_w8a8_per_token.json",
        "smollm2_hybrid2_on16_bidir_short_pertoken/best int8",
        "precision_agreement_hybrid_short_w8a8_per_token.json",
    )


def w8a8_row() -> list[str]:
    """The 16-block model (its third training) in W8A8 int8 as quantize's defaults leave it: every Linear's input per
    token, its near-ties confirmed in float32 (a copy of its folder, quantized so)."""
    return int8_row(
        "`ple` on the frozen SmolLM2-135M trunk, 16 blocks, W8A8 `--precision int8` after `mtl-decoder quantize`",
        "pretrained_throughput_frozen16_third.json",
        "smollm2_frozen_ple_pertoken/best int8",
        "precision_agreement_frozen16_third_per_token.json",
    )
