"""Our side of the throughput benchmarks: the benchmark model built untrained from a config, its int8 copy, a
timer of ``predict_texts``, its arithmetic per word and profile, the pretrained-trunk model, and the smaller
variants ``spacy_throughput.py --variants`` times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from bench_timing import REPO, timed, words_of


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
    from mtl_decoder.model.pretrained.state_cache import StateCache

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
