"""How far bf16 or int8 prediction is from fp32 on a trained model: the share of sentences, words and labels on which
``predict --precision P`` and the default fp32 agree, each one's test metric and its difference from fp32, and each
one's speed; for a frozen pretrained trunk also how close its states are.

    python benchmarks/precision_agreement.py [--model benchmarks/runs/ple/best] [--precisions bf16,int8]
                                             [--data-root ../shared/data] [--out FILE]

Data: CoNLL-2003 test (token lists) and SST-2 test (raw texts), every task predicted on every sentence, as
``mtl-decoder predict`` does; the metrics score each tagging task on CoNLL-2003's gold tags (entity F1, seqeval) and
each classification task on SST-2's gold labels (accuracy). A frozen trunk's state cache is an empty temporary
folder, read only: every sentence runs through the trunk at each precision. Each precision gets a freshly loaded
model (int8 quantises it in place). The model must have been trained (``python benchmarks/quality.py`` writes
benchmarks/runs/ple, the SmolLM2 recipes benchmarks/runs/smollm2_*): on an untrained model agreement says nothing.
Prints one JSON object (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from mtl_decoder.config import TAGGING
from mtl_decoder.inference.refine import close_to_a_tie
from mtl_decoder.prediction import predict_texts
from mtl_decoder.saved import load_model

REPO = Path(__file__).resolve().parents[1]


def load_items(data_root: Path) -> tuple[list[str | list[str]], list[list[str]], list[str]]:
    """The items (CoNLL-2003 test token lists, then SST-2 test texts), CoNLL's gold tags and SST-2's gold labels."""
    with open(data_root / "conll2003" / "test.jsonl", encoding="utf-8") as f:
        conll = [json.loads(line) for line in f if line.strip()]
    with open(data_root / "sst2" / "test.jsonl", encoding="utf-8") as f:
        sst2 = [json.loads(line) for line in f if line.strip()]
    items: list[str | list[str]] = [r["tokens"] for r in conll] + [r["text"] for r in sst2]
    return items, [r["ner_tags"] for r in conll], [r["label"] for r in sst2]


def precision_setting(name: str) -> tuple[str, bool]:
    """(precision, refine) of a name of --precisions: int8 as ``--precision int8`` runs it, int8-alone with
    ``--no-refine`` (no float32 pass over the texts close to a tie: inference/refine.py)."""
    return ("int8", False) if name == "int8-alone" else (name, True)


def timed_predictions(model_dir: str, items: list, precision: str, cache_dir: Path) -> tuple[list[dict], float]:
    saved = load_model(model_dir, "cpu")
    precision, refine = precision_setting(precision)
    settings = dict(precision=precision, cache_dir=cache_dir, refine=refine)
    list(predict_texts(saved, items[:200], **settings))  # warm-up (int8: quantise)
    start = time.perf_counter()
    preds = list(predict_texts(saved, items, **settings))
    return preds, len(items) / (time.perf_counter() - start)


def test_metrics(preds: list[dict], tasks: dict[str, str], gold_tags: list, gold_labels: list) -> dict:
    """Per task: entity F1 on CoNLL-2003 test (tagging) or accuracy on SST-2 test (classification)."""
    from seqeval.metrics import f1_score

    out = {}
    n = len(gold_tags)
    for task, kind in tasks.items():
        if kind == TAGGING:
            out[task] = {"conll2003_test_f1": round(f1_score(gold_tags, [p[task]["tags"] for p in preds[:n]]), 5)}
        else:
            right = sum(p[task]["label"] == g for p, g in zip(preds[n:], gold_labels, strict=True))
            out[task] = {"sst2_test_accuracy": round(right / len(gold_labels), 5)}
    return out


def agreement(fp32: list[dict], other: list[dict], tasks: dict[str, str]) -> dict:
    result = {}
    for task, kind in tasks.items():
        if kind == TAGGING:
            pairs = [(a[task]["tags"], b[task]["tags"]) for a, b in zip(fp32, other, strict=True)]
            words = sum(len(a) for a, _ in pairs)
            same_words = sum(x == y for a, b in pairs for x, y in zip(a, b, strict=True))
            result[task] = {
                "sentences_same_tags": round(sum(a == b for a, b in pairs) / len(pairs), 5),
                "words_same_tag": round(same_words / words, 5),
            }
        else:
            labels = sum(a[task]["label"] == b[task]["label"] for a, b in zip(fp32, other, strict=True))
            gap = max(
                abs(a[task]["probs"][k] - b[task]["probs"][k])
                for a, b in zip(fp32, other, strict=True)
                for k in a[task]["probs"]
            )
            result[task] = {"same_label": round(labels / len(fp32), 5), "max_prob_difference": round(gap, 4)}
    return result


def state_agreement(model_dir: str, items: list, precision: str, count: int = 200) -> dict | None:
    """A frozen trunk: the per-token relative error ||s_P - s_fp32|| / ||s_fp32|| of its states on ``count`` items
    (median, p90, p99), computed directly (no cache)."""
    from mtl_decoder.inference import Predictor

    def states(p: str) -> list[torch.Tensor]:
        saved = load_model(model_dir, "cpu")
        if not hasattr(saved.model, "states"):
            return []
        Predictor.from_saved(saved, precision=precision_setting(p)[0], refine=False)  # int8: quantises the trunk
        out = []
        for e in saved.encoder.encode_batch(items[:count]):
            ids = torch.tensor([e.ids])
            dtype = {"bf16": torch.bfloat16}.get(p)
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                out.append(saved.model.states.compute(ids, torch.ones_like(ids, dtype=torch.bool))[0])
        return out

    reference = states("fp32")
    if not reference:
        return None
    errors = (
        torch.cat([(b - a).norm(dim=-1) / a.norm(dim=-1) for a, b in zip(reference, states(precision), strict=True)])
        .sort()
        .values
    )
    pick = [errors[int(q * (len(errors) - 1))].item() for q in (0.5, 0.9, 0.99)]
    return {"items": count, "tokens": len(errors), "relative_error_median_p90_p99": [round(x, 4) for x in pick]}


def compare(model_dir: str, precisions: list[str], data_root: Path) -> dict:
    items, gold_tags, gold_labels = load_items(data_root)
    tasks = {t.name: t.kind for t in load_model(model_dir, "cpu").model.tasks}
    result: dict = {"benchmark": "precision_agreement", "sentences": len(items)}
    with tempfile.TemporaryDirectory(prefix="agreement-states-") as cache_dir:
        fp32, fp32_speed = timed_predictions(model_dir, items, "fp32", Path(cache_dir))
        reference = test_metrics(fp32, tasks, gold_tags, gold_labels)
        result["fp32"] = {"test": reference, "sentences_per_s": round(fp32_speed, 1)}
        runs: dict[str, list[dict]] = {}
        for precision in precisions:
            preds, speed = timed_predictions(model_dir, items, precision, Path(cache_dir))
            runs[precision] = preds
            metrics = test_metrics(preds, tasks, gold_tags, gold_labels)
            difference = {
                task: {k: round(v - reference[task][k], 5) for k, v in values.items()}
                for task, values in metrics.items()
            }
            result[precision] = {
                "agreement_with_fp32": agreement(fp32, preds, tasks),
                "test": metrics,
                "test_minus_fp32": difference,
                "sentences_per_s": round(speed, 1),
                "speed_over_fp32": round(speed / fp32_speed, 3),
                "trunk_states": None if precision == "int8-alone" else state_agreement(model_dir, items, precision),
            }
    if "int8" in result and "int8-alone" in runs:
        result["int8"]["refined"] = refined_shares(model_dir, runs["int8-alone"], tasks, len(gold_tags))
    result["torch_threads"] = torch.get_num_threads()
    return result


def refined_shares(model_dir: str, alone: list[dict], tasks: dict[str, str], conll: int) -> dict:
    """The margin the folder's quantize chose and the share of CoNLL and SST-2 texts int8 predicts again in float32
    under it: those whose int8-alone classification has its top two probabilities within the margin."""
    from mtl_decoder.inference.smoothquant import SCALES_FILE, load_scales

    margin = load_scales(Path(model_dir) / SCALES_FILE)[2].get("refine_margin", 0.0)
    classify = [t for t, kind in tasks.items() if kind != TAGGING]

    flags = [close_to_a_tie([p[t]["probs"] for t in classify], margin) for p in alone]
    return {"margin": margin, "conll2003_test": round(sum(flags[:conll]) / conll, 4),
            "sst2_test": round(sum(flags[conll:]) / (len(flags) - conll), 4)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from spacy_throughput import cpu_name, default_data_root

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(REPO / "benchmarks" / "runs" / "ple" / "best"))
    parser.add_argument("--precisions", default="bf16", help="compared with fp32 (comma list: bf16, int8, int8-alone)")
    parser.add_argument("--data-root", default=str(default_data_root()))
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    model = Path(args.model).resolve()
    shown = str(model.relative_to(REPO)) if model.is_relative_to(REPO) else str(model)
    result = {
        "model": shown,
        "cpu": cpu_name(),
        **compare(args.model, args.precisions.split(","), Path(args.data_root)),
    }
    text = json.dumps(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
