"""Issue 36 item 1: which SST-2 labels W8A8 int8 changes, and how close to the decision those sentences were.

    python benchmarks/w8a8_flips.py --model benchmarks/runs/smollm2_frozen_ple/best [--split test] [--pack-tokens N]

Predicts the SST-2 sentences of ``--split`` with the model folder at fp32 and at int8 (W8A8 with the folder's
SmoothQuant scales, as ``--precision int8`` runs it), one thread, and reports per sentence the change of the positive
class's probability: how many labels flip, how far from 0.5 the flipped sentences' fp32 probabilities were, and
how many sentences lie within the largest change of 0.5 at all (the ones any perturbation that large could flip).
Writes benchmarks/results/w8a8_flips.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spacy_throughput import REPO, cpu_name, default_data_root


def _probs(model: Path, texts: list[str], precision: str, pack_tokens: int | None) -> list[float]:
    import torch

    from mtl_decoder.prediction import predict_texts

    torch.set_num_threads(1)
    out = predict_texts(model, texts, tasks=["sst2"], precision=precision, workers=1, pack_tokens=pack_tokens)
    return [p["sst2"]["probs"]["positive"] for p in out]


def measure(args: argparse.Namespace) -> dict:
    rows = [json.loads(line) for line in (Path(args.data_root) / "sst2" / f"{args.split}.jsonl").open()]
    texts = [r.get("sentence") or r["text"] for r in rows]
    model, pack = Path(args.model), args.pack_tokens
    fp32, int8 = _probs(model, texts, "fp32", pack), _probs(model, texts, "int8", pack)
    change = [abs(a - b) for a, b in zip(fp32, int8, strict=True)]
    flipped = [i for i, (a, b) in enumerate(zip(fp32, int8, strict=True)) if (a >= 0.5) != (b >= 0.5)]
    margins = sorted(abs(fp32[i] - 0.5) for i in flipped)
    largest = max(change)
    return {
        "benchmark": "w8a8_flips",
        "model": str(args.model),
        "split": args.split,
        "pack_tokens": args.pack_tokens,
        "cpu": cpu_name(),
        "sentences": len(texts),
        "labels_identical": 1 - len(flipped) / len(texts),
        "flipped": len(flipped),
        "flipped_fp32_margins": [round(m, 4) for m in margins],
        "probability_change": {
            "median": statistics.median(change),
            "p99": sorted(change)[int(0.99 * (len(change) - 1))],
            "max": largest,
        },
        "within_largest_change_of_half": sum(abs(p - 0.5) < largest for p in fp32),
        "within_0.02_of_half": sum(abs(p - 0.5) < 0.02 for p in fp32),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--pack-tokens", type=int, help="the trunk's packed rows (default: the trunk's; 0: padded)")
    parser.add_argument("--data-root", default=str(default_data_root()))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "w8a8_flips.json"))
    args = parser.parse_args(argv)
    result = measure(args)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "flipped_fp32_margins"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
