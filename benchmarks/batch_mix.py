"""What the batch sampler hands the trainer on a benchmark config: each batch's task mix, padding, coverage.

    python benchmarks/batch_mix.py [--config configs/bench/ple.yaml] [--steps 6500] [--json OUT]

Builds the config's tokenizer on its training data (as `mtl-decoder train` does), encodes every training
example to get its sub-word length, then runs `MultiTaskBatchSampler` over the first ``--steps`` batches
(epochs in turn, as the trainer does) without training anything. Prints, for one process:

- the first source's share of a batch: 5th, 50th and 95th percentile, min and max, and the overall share;
- padding efficiency: real tokens / padded tokens (batch size x longest example of the batch), summed;
- coverage: per source, the fraction of its examples never drawn and the most times one was drawn.

Takes about a minute on a 2-core CPU (most of it the tokenizer and the encoding).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def source_lengths(config: Path) -> tuple[list[str], list[np.ndarray], dict]:
    from mtl_decoder.config import load_config
    from mtl_decoder.data.tokenization import TextEncoder
    from mtl_decoder.training.setup import encode_sources, make_tokenizer, read_data

    cfg = load_config(config)
    train, _, label_sets = read_data(cfg)
    encoder = TextEncoder.for_model(make_tokenizer(cfg, train), cfg.model, cfg.data.max_length)
    kinds = {name: t.kind for name, t in cfg.tasks.items()}
    encoded, _ = encode_sources(train, encoder, label_sets, kinds)
    names = ["+".join(t.name for t in s.tasks) for s in train]
    return names, [np.array([len(e.ids) for e in src]) for src in encoded], cfg


def measure(names: list[str], sizes: list[int], lengths: np.ndarray, cfg, steps: int, group: bool) -> dict:
    from mtl_decoder.data.batching import MultiTaskBatchSampler

    sampler = MultiTaskBatchSampler(
        sizes,
        cfg.data.batch_size,
        cfg.data.sampling,
        cfg.data.temperature,
        lengths,
        group,
        seed=cfg.training.seed,
    )
    batches, epoch = [], 0
    while len(batches) < steps:
        sampler.set_epoch(epoch)
        batches += list(sampler)[: steps - len(batches)]
        epoch += 1
    flat = np.array(batches)
    source = np.searchsorted(np.cumsum(sizes), flat, side="right")  # (steps, B)
    share = (source == 0).mean(axis=1)
    longest = lengths[flat].max(axis=1)
    coverage = {}
    offsets = np.cumsum([0, *sizes[:-1]])
    for k, size in enumerate(sizes):
        drawn = np.bincount(flat[source == k] - offsets[k], minlength=size)
        coverage[names[k]] = {"never_drawn": float((drawn == 0).mean()), "max_draws": int(drawn.max())}
    return {
        "batches": len(batches),
        "epochs": epoch,
        "first_source_share": {
            "p5": float(np.percentile(share, 5)),
            "p50": float(np.percentile(share, 50)),
            "p95": float(np.percentile(share, 95)),
            "min": float(share.min()),
            "max": float(share.max()),
            "overall": float(share.mean()),
        },
        "padding_efficiency": float(lengths[flat].sum() / (longest * flat.shape[1]).sum()),
        "coverage": coverage,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "bench" / "ple.yaml")
    parser.add_argument("--steps", type=int, default=None, help="batches to draw (default: training.max_steps)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    started = time.perf_counter()
    names, per_source, cfg = source_lengths(args.config)
    sizes = [len(x) for x in per_source]
    lengths = np.concatenate(per_source)
    steps = args.steps or cfg.training.max_steps or 1000
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    out = {
        "config": str(args.config.resolve().relative_to(REPO))
        if args.config.resolve().is_relative_to(REPO)
        else str(args.config),
        "commit": commit.stdout.strip(),
        "sources": dict(zip(names, sizes, strict=True)),
        "sampling": cfg.data.sampling,
        "batch_size": cfg.data.batch_size,
        "mean_length": {n: float(x.mean()) for n, x in zip(names, per_source, strict=True)},
        "grouped": measure(names, sizes, lengths, cfg, steps, group=True),
        "ungrouped": measure(names, sizes, lengths, cfg, steps, group=False),
    }
    out["seconds"] = time.perf_counter() - started
    for key in ("grouped", "ungrouped"):
        if key in out:
            r = out[key]
            s = r["first_source_share"]
            print(
                f"{key:9s} {names[0]} share p5/p50/p95 {s['p5']:.3f}/{s['p50']:.3f}/{s['p95']:.3f} "
                f"(min {s['min']:.3f}, max {s['max']:.3f}, overall {s['overall']:.3f}); "
                f"padding efficiency {r['padding_efficiency']:.3f}; "
                + "; ".join(
                    f"{name}: {c['never_drawn']:.1%} never drawn, max {c['max_draws']}x"
                    for name, c in r["coverage"].items()
                )
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
