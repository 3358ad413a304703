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
-- the architecture of the peer in ../shared/NOTES.md, whose quality is quoted beside ours. Initialised on 50
test sentences (NER labels, two sentiment labels), untrained: its work per word does not depend on the weights
either (one transition per word whatever the scores). --spacy-width 256 --spacy-depth 8 gives spaCy's "accuracy"
CNN instead.

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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPACY_PYTHON = REPO.parent / "scratch" / "spacy-venv" / "bin" / "python"
BUSY_SHARE = 0.1
"""A thread 'did the work' when it took at least this share of its process's CPU time during a measurement."""


# ---------------------------------------------------------------------------------------------- both sides


def default_data_root() -> Path:
    """../shared/data beside the checkout (or beside the folder of worktrees that holds it)."""
    for root in (REPO.parent, REPO.parent.parent):
        if (root / "shared" / "data").is_dir():
            return root / "shared" / "data"
    return REPO.parent / "shared" / "data"


def read_sentences(data_root: Path, count: int) -> list[list[str]]:
    """The first ``count`` CoNLL-2003 test token lists (0: all)."""
    with open(data_root / "conll2003" / "test.jsonl", encoding="utf-8") as f:
        items = [json.loads(line)["tokens"] for line in f if line.strip()]
    return items[:count] if count else items


def thread_ticks() -> dict[str, int]:
    """CPU clock ticks (user + system) of each thread of this process (Linux; empty elsewhere)."""
    ticks = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks[tid] = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except OSError:
        return {}
    return ticks


class ThreadSampler:
    """The CPU ticks each thread of this process used while it ran, sampled every ``every`` seconds (threads that
    start and end within a measurement, such as the Predictor's workers, are seen up to their last sample)."""

    def __init__(self, every: float = 0.05):
        import threading

        self.every, self.stop = every, threading.Event()
        self.first, self.last = thread_ticks(), {}
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(self.every):
            self.last.update(thread_ticks())

    def finish(self) -> dict[str, int]:
        self.stop.set()
        self.thread.join()
        self.last.update(thread_ticks())
        me = str(self.thread.native_id)
        return {tid: t - self.first.get(tid, 0) for tid, t in self.last.items() if tid != me}


def timed(fn) -> dict:
    """Run ``fn`` (-> words) and measure wall time, process CPU time and the threads that did the work."""
    sampler = ThreadSampler()
    cpu, start = time.process_time(), time.perf_counter()
    words = fn()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    used = sampler.finish()
    total = sum(used.values())
    return {
        "words": words,
        "seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "words_per_s": round(words / wall, 1),
        "words_per_cpu_s": round(words / cpu, 1) if cpu > 0 else None,
        "busy_threads": sum(1 for v in used.values() if total and v >= BUSY_SHARE * total),
    }


# ---------------------------------------------------------------------------------------------- spaCy (worker)

SPACY_CONFIG = """
[nlp]
lang = "en"
pipeline = ["tok2vec", "ner", "textcat"]

[components]

[components.tok2vec]
factory = "tok2vec"

[components.tok2vec.model]
@architectures = "spacy.Tok2Vec.v2"

[components.tok2vec.model.embed]
@architectures = "spacy.MultiHashEmbed.v2"
width = {width}
attrs = ["NORM", "PREFIX", "SUFFIX", "SHAPE"]
rows = [5000, 1000, 2500, 2500]
include_static_vectors = false

[components.tok2vec.model.encode]
@architectures = "spacy.MaxoutWindowEncoder.v2"
width = {width}
depth = {depth}
window_size = 1
maxout_pieces = 3

[components.ner]
factory = "ner"

[components.ner.model]
@architectures = "spacy.TransitionBasedParser.v2"
state_type = "ner"
extra_state_tokens = false
hidden_width = 64
maxout_pieces = 2
use_upper = true

[components.ner.model.tok2vec]
@architectures = "spacy.Tok2VecListener.v1"
width = {width}
upstream = "*"

[components.textcat]
factory = "textcat"

[components.textcat.model]
@architectures = "spacy.TextCatReduce.v1"
exclusive_classes = true
use_reduce_first = false
use_reduce_last = false
use_reduce_max = true
use_reduce_mean = true

[components.textcat.model.tok2vec]
@architectures = "spacy.Tok2VecListener.v1"
width = {width}
upstream = "*"
"""


def bio_spans(tags: list[str]) -> list[tuple[int, int, str]]:
    """(start, end, label) word spans of IOB/BIO tags."""
    spans, start, label = [], None, None
    for i, tag in enumerate([*tags, "O"]):
        if tag == "O" or tag.startswith("B-") or tag[2:] != label:
            if start is not None:
                spans.append((start, i, label))
            start, label = (i, tag[2:]) if tag != "O" else (None, None)
    return spans


def spacy_worker(options: dict) -> None:
    """Build the pipeline, say 'ready' (one JSON line), then time ``nlp.pipe`` over the sentences on every 'run'."""
    import spacy
    from spacy.tokens import Doc
    from spacy.training import Example
    from thinc.api import Config

    config = Config().from_str(SPACY_CONFIG.format(width=options["width"], depth=options["depth"]))
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    data_root = Path(options["data_root"])
    with open(data_root / "conll2003" / "test.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    examples = []
    for k, record in enumerate(records[:50]):
        reference = Doc(nlp.vocab, words=record["tokens"])
        reference.ents = [
            spacy.tokens.Span(reference, s, e, label=label) for s, e, label in bio_spans(record["ner_tags"])
        ]
        reference.cats = {"positive": float(k % 2), "negative": float(1 - k % 2)}
        examples.append(Example(Doc(nlp.vocab, words=record["tokens"]), reference))
    nlp.initialize(lambda: examples)
    items = read_sentences(data_root, options["sentences"])

    def run(sentences: list[list[str]]) -> int:
        docs = list(nlp.pipe(Doc(nlp.vocab, words=words) for words in sentences))
        assert all(d.cats for d in docs)
        return sum(len(d) for d in docs)

    run(items[:300])  # warm-up
    macs = 0  # multiply-adds per token, from the weight shapes of every layer that multiplies (not the lookups)
    for name in nlp.pipe_names:
        for node in nlp.get_pipe(name).model.walk():
            if node.has_param("W") and node.name != "hashembed":
                macs += int(node.get_param("W").size)
    info = {
        "ready": True,
        "spacy": spacy.__version__,
        "pipeline": nlp.pipe_names,
        "ner_moves": nlp.get_pipe("ner").moves.n_moves,
        "textcat_labels": list(nlp.get_pipe("textcat").labels),
        "mflop_per_word_estimate": round(2 * macs / 1e6, 2),
        "blas": _blas_threads(),
    }
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        print(json.dumps(timed(lambda: run(items))), flush=True)


def _blas_threads() -> list[dict]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [{k: pool.get(k) for k in ("internal_api", "num_threads")} for pool in threadpool_info()]


class SpacyProcess:
    """The spaCy worker, started from spaCy's own virtual environment."""

    def __init__(self, python: Path, options: dict):
        if not Path(python).exists():
            raise SystemExit(
                f"{python}: no spaCy interpreter; create one with\n  python -m venv {Path(python).parents[1]} && "
                f'{Path(python).parent}/pip install "spacy==3.8.*"\nor pass --spacy-python'
            )
        self.proc = subprocess.Popen(
            [str(python), __file__, "--spacy-worker", json.dumps(options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.info = self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the spaCy worker stopped (exit status {self.proc.wait()})")
        return json.loads(line)

    def run(self) -> dict:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# ---------------------------------------------------------------------------------------------- ours


def untrained_model(config_path: Path, data_root: Path, overrides: list[str] = ()):
    """The model of ``config_path``, untrained, with its tokenizer: the config's own (trained on CoNLL-2003 and
    SST-2 train) or a pretrained trunk's."""
    import torch

    from mtl_decoder.config import load_config
    from mtl_decoder.data.iob import sort_tag_labels
    from mtl_decoder.data.tokenization import TextEncoder, train_tokenizer
    from mtl_decoder.model import build_model
    from mtl_decoder.saved import SavedModel

    config = load_config(config_path, list(overrides))
    tags: set[str] = {"O"}
    with open(data_root / "conll2003" / "train.jsonl", encoding="utf-8") as f:
        train: list = [json.loads(line) for line in f]
    tags.update(t for record in train for t in record["ner_tags"])
    if config.model.trunk.enabled:
        from mtl_decoder.model.pretrained.hub import load_tokenizer

        tokenizer = load_tokenizer(config.model.trunk)
    else:
        with open(data_root / "sst2" / "train.jsonl", encoding="utf-8") as f:
            texts = [r["tokens"] for r in train] + [json.loads(line)["text"] for line in f]
        tokenizer = train_tokenizer(texts, config.tokenizer)
    encoder = TextEncoder.for_model(tokenizer, config.model, config.data.max_length)
    label_sets = {
        name: list(task.labels) if task.labels else sort_tag_labels(tags) for name, task in config.tasks.items()
    }
    torch.manual_seed(0)
    model = build_model(config, label_sets, encoder).eval()
    return SavedModel(model, encoder, config, label_sets, Path(f"untrained:{config_path.name}"))


def int8_linear(saved):
    """A copy of ``saved`` with torch's dynamic int8 quantisation on every nn.Linear a forward pass calls as a
    module (attention projections, task heads); the gates read their weights directly and stay float32."""
    import copy
    import warnings

    import torch

    model = copy.deepcopy(saved.model)
    names = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not n.endswith(".proj")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        model = torch.ao.quantization.quantize_dynamic(model, names, dtype=torch.qint8)
    return type(saved)(model, saved.encoder, saved.config, saved.label_sets, saved.directory), sorted(names)


def ours(saved, items: list[list[str]], threads: int, precision: str = "fp32", batch_size: int = 64):
    """A function timing ``predict_texts`` on ``items`` with ``threads`` torch threads (1: one worker)."""
    import torch

    from mtl_decoder.prediction import predict_texts

    def run() -> int:
        torch.set_num_threads(threads)
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
        preds = list(
            predict_texts(saved, items, batch_size=batch_size, precision=precision, workers=1 if threads == 1 else None)
        )
        return sum(next(len(v["tags"]) for v in p.values() if "tags" in v) for p in preds)  # words tagged

    return run


def words_of(items: list[list[str]]) -> int:
    return sum(len(words) for words in items)


def flops_per_word(saved, items: list[list[str]]) -> float:
    """MFLOP per word of ``saved`` on ``items`` at batch size 64, as the torch profiler counts them (matrix
    products; attention's own kernel is not counted)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    run = ours(saved, items, 1)
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        run()
    return sum(e.flops for e in prof.key_averages()) / words_of(items) / 1e6


def profile_table(saved, items: list[list[str]], rows: int = 12) -> list[dict]:
    """Where a 1-thread prediction pass over ``items`` spends its time: the top operators by self CPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    run = ours(saved, items, 1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    return [{"op": e.key, "share": round(e.self_cpu_time_total / total, 3), "calls": e.count} for e in events[:rows]]


def trunk_model(args: argparse.Namespace, data_root: Path, cache_root: Path):
    """The pretrained-trunk model (trained folder or untrained from the config) and a function that empties its
    state cache, so that every sentence runs through the trunk."""
    from mtl_decoder.model.pretrained.frozen import StateCache

    os.environ["MTL_DECODER_CACHE"] = str(cache_root)  # never the user's cache: timing only
    trained = Path(args.trunk_model) if args.trunk_model else REPO / "benchmarks/runs/smollm2_frozen_ple/best"
    if trained.is_dir():
        from mtl_decoder.saved import load_model

        saved, source = load_model(trained, "cpu"), f"{trained} (trained)"
    else:
        config = REPO / "configs/bench/smollm2_frozen.yaml"
        saved = untrained_model(config, data_root, [f"model.trunk.cache_dir={cache_root}"])
        source = "configs/bench/smollm2_frozen.yaml model section, untrained (no trained folder yet)"

    def reset() -> None:
        saved.model.states.cache = StateCache(None)

    return saved, source, reset


# ---------------------------------------------------------------------------------------------- the run


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            info = f.read()
    except OSError:
        return platform.processor()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    family = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("cpu family")), "")
    number = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model\t")), "")
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx_vnni") if f in flags)
    return f"{model} (family {family}, model {number}), {os.cpu_count()} cores, {isa or 'no AVX2'}"


def median_of(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 1)


SIZE_VARIANTS = {
    "ffn=mlp (one route, no experts)": ["model.ffn=mlp"],
    "mlp, d_model 128, 2 layers": ["model.ffn=mlp", "model.d_model=128", "model.n_layers=2"],
    "mlp, d_model 96, 2 layers": ["model.ffn=mlp", "model.d_model=96", "model.n_layers=2"],
    "mlp, d_model 96, 2 layers, no char CNN, no hashed words": [
        "model.ffn=mlp",
        "model.d_model=96",
        "model.n_layers=2",
        "model.char_embedding=0",
        "model.word_hash_buckets=0",
    ],
}
"""Smaller models than the benchmark's (overrides of configs/bench/ple.yaml), timed untrained with --variants:
what a model that matches spaCy's speed would have to give up. Their quality is not measured here."""


def size_variants(bench, data_root: Path, items: list[list[str]]) -> list[dict]:
    """Each SIZE_VARIANTS model (untrained) at 1 thread on ``items``, twice, beside the benchmark model."""
    out = []
    for name, overrides in {"configs/bench/ple.yaml": None, **SIZE_VARIANTS}.items():
        saved = bench if overrides is None else untrained_model(REPO / "configs/bench/ple.yaml", data_root, overrides)
        run = ours(saved, items, 1)
        run()  # warm-up
        runs = [timed(run) for _ in range(2)]
        out.append(
            {
                "model": name,
                "overrides": overrides or [],
                "parameters": saved.model.num_parameters(),
                "mflop_per_word": round(flops_per_word(saved, items[:300]), 2),
                "words_per_s": statistics.median(r["words_per_s"] for r in runs),
                "words_per_cpu_s": statistics.median(r["words_per_cpu_s"] for r in runs),
            }
        )
        print(f"variant {out[-1]}", file=sys.stderr)
    return out


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
