"""How far bf16 prediction is from fp32 on a trained model: the share of sentences, words and labels on which
``predict --precision bf16`` and the default fp32 agree, and each one's speed.

    python benchmarks/precision_agreement.py [--model benchmarks/runs/ple/best] [--data-root ../shared/data]

Data: CoNLL-2003 test (token lists) and SST-2 test (raw texts), every task predicted on every sentence, as
``mtl-decoder predict`` does. The model must have been trained (``python benchmarks/quality.py`` writes
benchmarks/runs/ple): on an untrained model agreement says nothing. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from mtl_decoder.config import TAGGING
from mtl_decoder.prediction import predict_texts
from mtl_decoder.saved import load_model

REPO = Path(__file__).resolve().parents[1]


def load_items(data_root: Path) -> list[str | list[str]]:
    with open(data_root / "conll2003" / "test.jsonl", encoding="utf-8") as f:
        items: list[str | list[str]] = [json.loads(line)["tokens"] for line in f]
    with open(data_root / "sst2" / "test.jsonl", encoding="utf-8") as f:
        items += [json.loads(line)["text"] for line in f]
    return items


def timed_predictions(pretrained, items: list, precision: str) -> tuple[list[dict], float]:
    list(predict_texts(pretrained, items[:200], precision=precision))  # warm-up
    start = time.perf_counter()
    preds = list(predict_texts(pretrained, items, precision=precision))
    return preds, len(items) / (time.perf_counter() - start)


def compare(pretrained, items: list) -> dict:
    fp32, fp32_speed = timed_predictions(pretrained, items, "fp32")
    bf16, bf16_speed = timed_predictions(pretrained, items, "bf16")
    result: dict = {"benchmark": "precision_agreement", "sentences": len(items)}
    for task, kind in ((t.name, t.kind) for t in pretrained.model.tasks):
        if kind == TAGGING:
            pairs = [(a[task]["tags"], b[task]["tags"]) for a, b in zip(fp32, bf16, strict=True)]
            words = sum(len(a) for a, _ in pairs)
            same_words = sum(x == y for a, b in pairs for x, y in zip(a, b, strict=True))
            result[task] = {
                "sentences_same_tags": round(sum(a == b for a, b in pairs) / len(pairs), 5),
                "words_same_tag": round(same_words / words, 5),
            }
        else:
            labels = sum(a[task]["label"] == b[task]["label"] for a, b in zip(fp32, bf16, strict=True))
            gap = max(
                abs(a[task]["probs"][k] - b[task]["probs"][k])
                for a, b in zip(fp32, bf16, strict=True)
                for k in a[task]["probs"]
            )
            result[task] = {"same_label": round(labels / len(fp32), 5), "max_prob_difference": round(gap, 4)}
    result["sentences_per_s"] = {"fp32": round(fp32_speed, 1), "bf16": round(bf16_speed, 1)}
    result["torch_threads"] = torch.get_num_threads()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(REPO / "benchmarks" / "runs" / "ple" / "best"))
    parser.add_argument("--data-root", default=str(REPO.parent / "shared" / "data"))
    args = parser.parse_args(argv)
    pretrained = load_model(args.model)
    model = Path(args.model).resolve()
    shown = str(model.relative_to(REPO)) if model.is_relative_to(REPO) else str(model)
    result = {"model": shown, **compare(pretrained, load_items(Path(args.data_root)))}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
