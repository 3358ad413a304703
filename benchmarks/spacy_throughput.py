"""Prediction throughput of the from-scratch real-data model against spaCy's CNN pipeline, on the same words, the
same machine and the same number of threads, measured alternately in one run.

    python benchmarks/spacy_throughput.py [--json] [--out benchmarks/results/spacy_throughput.json]
                                          [--spacy-python PATH] [--rounds 3] [--model DIR]

spaCy is not a dependency of this project: it runs in its own virtual environment, as a worker process of this
script (the same file, ``--spacy-worker``), which reads the same input file and answers "run" on its stdin:

    python -m venv ../scratch/spacy-venv && ../scratch/spacy-venv/bin/pip install "spacy==3.8.*"

Input: the CoNLL-2003 test sentences (pre-tokenised ``tokens``), every one (--sentences 0). Both systems get the
same words: ours ``predict_texts`` on the token lists (every task: NER tags and the sentiment label), spaCy
``nlp.pipe`` on ``Doc(vocab, words=tokens)`` (the tok2vec, ner and textcat components).

Ours: configs/bench/ple.yaml, the real-data benchmark model (14.6M parameters: 3 bidirectional PLE layers of 192,
a character CNN, hashed word and shape features, a CRF); a trained model folder with --model, else (the default
when benchmarks/runs/ple/best does not exist) built untrained from the config's model section with its BPE
tokenizer trained on CoNLL-2003 + SST-2 train. Speed does not depend on the weights: the work per word is the
same (the CRF's Viterbi runs over every tag whatever the scores).

spaCy: spaCy 3.8, one pipeline, a blank English model with a shared CNN tok2vec (MultiHashEmbed of NORM, PREFIX,
SUFFIX and SHAPE, MaxoutWindowEncoder, width 96, depth 4: spaCy's default CNN, no vectors) read by ``ner``
(TransitionBasedParser, hidden 64) and ``textcat`` (TextCatReduce, mean and max pooling, over the same tok2vec)
-- the architecture of the peer (benchmarks/peers/spacy_pipeline.py), whose quality is quoted beside ours.
Initialised on 50 test sentences (NER labels, two sentiment labels), untrained: its work per word does not depend
on the weights either (one transition per word whatever the scores). --spacy-width 256 --spacy-depth 8 gives
spaCy's "accuracy" CNN instead.

Threads: "1 thread" is torch.set_num_threads(1) and one Predictor worker (ours), and spaCy's single process
(n_process=1; thinc runs its matmuls in blis, which is single-threaded here -- the worker reports which of its
threads did the work). Ours at 2 threads is the default predict setting (2 workers of 1 torch thread each). Each
measurement also reports process CPU seconds, words per CPU second (the machine is shared: CPU time is what a
system took of its cores whatever the others did) and the threads that did the work (from /proc).

The machine may be shared with other jobs: every round times each system once on all the sentences, in
alternating order, and the summary gives the medians and the median of the per-round ratios. bf16 (autocast) is
measured once on a subset, alternating with fp32 on the same subset. --int8 adds torch's dynamic int8
quantisation of the model's nn.Linear layers (attention and heads; the experts are grouped matmuls of their own,
which it does not reach), as a measurement only. --trunk-sentences times the pretrained trunk model
(configs/bench/smollm2_frozen.yaml: SmolLM2-135M's first 16 blocks, frozen, under 2 PLE layers; a trained folder
with --trunk-model, by default benchmarks/runs/smollm2_frozen_ple/best when it exists, else built untrained from
the config) with its state cache in a temporary folder, emptied before each measurement, so that every sentence
runs through the trunk, as a new text does at prediction.

The parts: bench_timing.py (the input, the timer, the machine), spacy_worker.py (spaCy's pipeline, its worker and
the process that runs it), bench_models.py (our models and the timer of our prediction); this file runs them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

# The helpers live beside this script, split by side; the names other benchmarks and tests import from here stay.
from bench_models import (  # noqa: F401
    SIZE_VARIANTS,
    flops_per_word,
    int8_linear,
    ours,
    profile_table,
    size_variants,
    trunk_model,
    untrained_model,
)
from bench_timing import (  # noqa: F401
    BUSY_SHARE,
    REPO,
    ThreadSampler,
    cpu_name,
    default_data_root,
    median_of,
    read_sentences,
    thread_ticks,
    timed,
    words_of,
)
from spacy_worker import DEFAULT_SPACY_PYTHON, SPACY_CONFIG, SpacyProcess, bio_spans, spacy_worker  # noqa: F401


def spacy_peer_quality(path: Path = REPO / "benchmarks/results/peers.json") -> dict | None:
    """The quality of this pipeline trained on the same data, as benchmarks/peers/spacy_pipeline.py stored it
    (None before that has run)."""
    try:
        peer = json.loads(path.read_text(encoding="utf-8"))["peers"]["spacy"]
    except (OSError, KeyError, ValueError):
        return None
    return {
        "source": f"benchmarks/results/peers.json peer 'spacy' ({peer['run']['date']}, commit {peer['run']['commit']})",
        "conll2003_f1": {"validation": peer["conll2003"]["validation_f1"], "test": peer["conll2003"]["test_f1"]},
        "sst2_accuracy": {"validation": peer["sst2"]["validation_accuracy"], "test": peer["sst2"]["test_accuracy"]},
    }


def quality_quote(path: Path = REPO / "benchmarks/results/quality.json", run: str = "ple") -> dict:
    """The quality of the benchmark model as benchmarks/results/quality.json holds it, beside spaCy's peer."""
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))["runs"][run]
    except (OSError, KeyError, ValueError):
        return {"ours": None, "spacy_peer": spacy_peer_quality()}
    metrics = entry["metrics"]
    ours = {
        "source": f"benchmarks/results/quality.json run '{run}' ({entry.get('date')}, commit {entry.get('commit')}, "
        f"{entry.get('steps')} steps, best step {entry.get('best_step')}, CPU {entry.get('cpu')}, "
        f"AVX-512 {entry.get('avx512')})",
        "conll2003_f1": {split: round(metrics[split]["conll2003"]["f1"], 4) for split in ("validation", "test")},
        "sst2_accuracy": {split: round(metrics[split]["sst2"]["accuracy"], 4) for split in ("validation", "test")},
    }
    return {"ours": ours, "spacy_peer": spacy_peer_quality()}


def measure(args: argparse.Namespace) -> dict:
    import torch

    data_root = Path(args.data_root)
    items = read_sentences(data_root, args.sentences)
    words = words_of(items)
    trained = Path(args.model) if args.model else REPO / "benchmarks/runs/ple/best"
    if trained.is_dir():
        from mtl_decoder.saved import load_model

        saved, model_source = load_model(trained, "cpu"), f"{trained} (trained)"
    else:
        saved = untrained_model(REPO / "configs/bench/ple.yaml", data_root)
        model_source = (
            "configs/bench/ple.yaml model section, untrained (speed does not depend on the weights), BPE 16k "
            "tokenizer trained on CoNLL-2003 + SST-2 train"
        )
    spacy_options = {
        "data_root": str(data_root),
        "sentences": args.sentences,
        "width": args.spacy_width,
        "depth": args.spacy_depth,
    }
    spacy = SpacyProcess(Path(args.spacy_python), spacy_options)
    threads0 = torch.get_num_threads()
    ours(saved, items[:300], 1)()  # warm-up (spaCy's worker warmed up before saying ready)
    ways = {"ours_1_thread": ours(saved, items, 1), "spacy_1_process": None}
    if args.two_threads:
        ways["ours_2_threads"] = ours(saved, items, 2)
    rounds: list[dict] = []
    for r in range(args.rounds):
        names = list(ways) if r % 2 == 0 else list(ways)[::-1]
        row = {}
        for name in names:
            row[name] = spacy.run() if ways[name] is None else timed(ways[name])
            assert row[name]["words"] == words, (name, row[name]["words"], words)
            print(f"round {r}: {name:16s} {row[name]}", file=sys.stderr)
        row["spacy_over_ours_1_thread"] = round(
            row["spacy_1_process"]["words_per_s"] / row["ours_1_thread"]["words_per_s"], 2
        )
        rounds.append(row)
    spacy.close()
    summary = {
        name: {
            "words_per_s": median_of([r[name] for r in rounds], "words_per_s"),
            "words_per_cpu_s": median_of([r[name] for r in rounds], "words_per_cpu_s"),
            "sentences_per_s": round(median_of([r[name] for r in rounds], "words_per_s") * len(items) / words, 1),
            "busy_threads": [r[name]["busy_threads"] for r in rounds],
        }
        for name in ways
    }
    ratios = [r["spacy_over_ours_1_thread"] for r in rounds]
    summary["spacy_over_ours_1_thread"] = {"median": statistics.median(ratios), "rounds": ratios}
    summary["spacy_over_ours_per_cpu_s"] = round(
        summary["spacy_1_process"]["words_per_cpu_s"] / summary["ours_1_thread"]["words_per_cpu_s"], 2
    )
    result: dict = {
        "benchmark": "spacy_throughput",
        "cpu": cpu_name(),
        "load_average_before": None,
        "input": f"CoNLL-2003 test, first {len(items)} sentences ({words} words), pre-tokenised; both systems get "
        "the same words and predict every task (NER tags and the sentence's sentiment label)",
        "sentences": len(items),
        "words": words,
        "ours": {
            "model": model_source,
            "parameters": saved.model.num_parameters(),
            "batch_size": 64,
            "mflop_per_word": round(flops_per_word(saved, items[:300]), 2),
        },
        "spacy": {
            "pipeline": f"blank en, tok2vec (MultiHashEmbed + MaxoutWindowEncoder, width {args.spacy_width}, "
            f"depth {args.spacy_depth}, no vectors) shared by ner (TransitionBasedParser, hidden 64) and textcat "
            "(TextCatReduce mean+max); initialised on 50 sentences, untrained (speed does not depend on the "
            "weights); nlp.pipe on Doc(vocab, words=tokens), n_process=1, default batch size",
            **{k: v for k, v in spacy.info.items() if k != "ready"},
        },
        "rounds": rounds,
        "summary": summary,
        "quality": quality_quote(),
    }
    sub = items[: args.bf16_sentences]
    if sub:
        result["bf16"] = precision_check(saved, sub)
    if args.int8:
        quantised, names = int8_linear(saved)
        row = []
        for k in range(2):
            pair = [("fp32", saved), ("int8", quantised)]
            for name, model in pair if k % 2 == 0 else pair[::-1]:
                row.append((name, timed(ours(model, items[: args.int8_sentences], 1))))
        fp32 = statistics.median(m["words_per_s"] for n, m in row if n == "fp32")
        int8 = statistics.median(m["words_per_s"] for n, m in row if n == "int8")
        result["int8_linear"] = {
            "quantised_modules": names,
            "fp32_words_per_s": fp32,
            "int8_words_per_s": int8,
            "int8_over_fp32": round(int8 / fp32, 2),
            "runs": [{"precision": n, **m} for n, m in row],
        }
    result["ours"]["profile_1_thread"] = profile_table(saved, items[:300])
    if args.variants:
        result["size_variants"] = {
            "sentences": min(len(items), args.variant_sentences),
            "note": "untrained, 1 thread, median of 2 runs each; speed only (these models' quality is not measured)",
            "models": size_variants(saved, data_root, items[: args.variant_sentences]),
        }
    if args.trunk_sentences:
        with tempfile.TemporaryDirectory(prefix="trunk-states-") as cache_root:
            result["pretrained_trunk"] = trunk_check(args, data_root, Path(cache_root), items[: args.trunk_sentences])
    torch.set_num_threads(threads0)
    result["torch"] = torch.__version__
    result["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def precision_check(saved, sub: list[list[str]]) -> dict:
    """bf16 autocast against fp32 on the same sentences at 1 thread: fp32, bf16, fp32 (bf16 is compared with the
    mean of the two fp32 runs around it)."""
    runs = [timed(ours(saved, sub, 1, p)) for p in ("fp32", "bf16", "fp32")]
    fp32 = (runs[0]["words_per_s"] + runs[2]["words_per_s"]) / 2
    return {
        "sentences": len(sub),
        "words": runs[1]["words"],
        "fp32_words_per_s": round(fp32, 1),
        "bf16_words_per_s": runs[1]["words_per_s"],
        "bf16_over_fp32": round(runs[1]["words_per_s"] / fp32, 3),
        "runs": runs,
    }


def trunk_check(args: argparse.Namespace, data_root: Path, cache_root: Path, sub: list[list[str]]) -> dict:
    saved, source, reset = trunk_model(args, data_root, cache_root)
    reset()
    ours(saved, sub[:20], 1)()  # warm-up
    out: dict = {"model": source, "parameters_total": None, "sentences": len(sub), "words": words_of(sub)}
    out["parameters_total"] = saved.model.num_parameters() + sum(
        p.numel() for p in saved.model.states.base.parameters()
    )
    out["trunk_blocks"] = saved.config.model.trunk.layers
    out["quality"] = quality_quote(run="smollm2_frozen_ple")["ours"]
    for threads in (1, 2):
        reset()
        m = timed(ours(saved, sub, threads))
        cache = saved.model.states.cache
        m["trunk_runs"] = cache.misses
        m["cache_hits"] = cache.hits
        out[f"{threads}_thread" + ("s" if threads > 1 else "")] = m
        print(f"trunk {threads} thread(s): {m}", file=sys.stderr)
    return out


def trunk_only(args: argparse.Namespace) -> dict:
    """--trunk-only: the pretrained trunk model, and the benchmark model on the same sentences at 1 thread before
    and after it (a ratio measured under the same load)."""
    data_root = Path(args.data_root)
    sub = read_sentences(data_root, args.trunk_sentences or 100)
    bench = untrained_model(REPO / "configs/bench/ple.yaml", data_root)
    run = ours(bench, sub, 1)
    run()  # warm-up
    before = timed(run)
    with tempfile.TemporaryDirectory(prefix="trunk-states-") as cache_root:
        trunk = trunk_check(args, data_root, Path(cache_root), sub)
    after = timed(run)
    per_cpu = (before["words_per_cpu_s"] + after["words_per_cpu_s"]) / 2
    trunk["bench_model_1_thread"] = {"before": before, "after": after}
    trunk["bench_over_trunk_per_cpu_s"] = round(per_cpu / trunk["1_thread"]["words_per_cpu_s"], 1)
    return {"benchmark": "spacy_throughput --trunk-only", "cpu": cpu_name(), "pretrained_trunk": trunk}


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--spacy-worker":
        spacy_worker(json.loads(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default=str(default_data_root()), help="folder with conll2003/")
    parser.add_argument("--sentences", type=int, default=0, help="CoNLL-2003 test sentences (0: all)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (each system once per round)")
    parser.add_argument("--model", default=None, help="a trained model folder (default: benchmarks/runs/ple/best)")
    parser.add_argument("--spacy-python", default=os.environ.get("SPACY_PYTHON", str(DEFAULT_SPACY_PYTHON)))
    parser.add_argument("--spacy-width", type=int, default=96)
    parser.add_argument("--spacy-depth", type=int, default=4)
    parser.add_argument("--no-two-threads", dest="two_threads", action="store_false", help="skip ours at 2 threads")
    parser.add_argument("--bf16-sentences", type=int, default=200, help="bf16 check on this many sentences (0: no)")
    parser.add_argument("--int8", action="store_true", help="also time dynamic int8 nn.Linear layers")
    parser.add_argument("--int8-sentences", type=int, default=1000)
    parser.add_argument("--variants", action="store_true", help="also time smaller untrained models (speed only)")
    parser.add_argument("--variant-sentences", type=int, default=800)
    parser.add_argument("--trunk-sentences", type=int, default=0, help="time the pretrained trunk model (0: no)")
    parser.add_argument("--trunk-model", default=None, help="a trained trunk model folder")
    parser.add_argument("--trunk-only", action="store_true", help="only the trunk model (and ours beside it)")
    parser.add_argument("--out", default=None, help="write the JSON result here")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    load = [round(x, 2) for x in os.getloadavg()]
    result = measure(args) if not args.trunk_only else trunk_only(args)
    result["load_average_before"] = load
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text if args.json or args.trunk_only else _report(result))
    return 0


def _report(result: dict) -> str:
    s = result["summary"]
    lines = [f"machine: {result['cpu']}; torch {result.get('torch')}", result["input"]]
    for name in ("ours_1_thread", "spacy_1_process", "ours_2_threads"):
        if name in s:
            lines.append(
                f"{name:16s} {s[name]['words_per_s']:>9,.0f} words/s  {s[name]['words_per_cpu_s']:>9,.0f} words/CPU-s"
                f"  busy threads {s[name]['busy_threads']}"
            )
    lines.append(f"spaCy / ours at 1 thread: {s['spacy_over_ours_1_thread']}")
    for key in ("bf16", "int8_linear", "pretrained_trunk"):
        if key in result:
            lines.append(f"{key}: {json.dumps({k: v for k, v in result[key].items() if k != 'runs'})}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
