"""What W8A8 of a hybrid's trained top blocks costs in agreement: the same model in int8 with scales for its cached
blocks only (the top blocks float32, the code before inference/smoothquant_top.py) and with its top blocks int8 too,
per-tensor or per-token activations, each against float32 on the same test texts (issue 36 item 1).

    python benchmarks/w8a8_top_ablation.py --model RUN/best [--variants cached_only,top,top_per_token]
                                           [--calibration-texts 512] [--out benchmarks/results/w8a8_top_ablation.json]

The texts and measures are benchmarks/precision_agreement.py's (CoNLL-2003 test token lists then SST-2 test texts,
every task predicted; the share of CoNLL sentences whose tags are all float32's, of SST-2 labels that are, and each
test metric). Float32 runs once; every variant is a fresh load of the folder, its scales made here by
``quantize.make_scales`` (calibrated on the model's training texts as ``mtl-decoder quantize`` does; the folder's own
scales are not read) and int8 run alone (no texts predicted again in float32), then, at the margin the folder's
``quantize`` chose, the share that agrees once the texts within it are (``inference/refine.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from precision_agreement import agreement, load_items, test_metrics
from quality_record import machine
from spacy_throughput import cpu_name, default_data_root

from mtl_decoder.config import TAGGING
from mtl_decoder.inference.quantize import use_smoothing
from mtl_decoder.inference.refine import close_to_a_tie
from mtl_decoder.inference.smoothquant import SCALES_FILE, SmoothQuantSettings, load_scales
from mtl_decoder.prediction import predict_texts
from mtl_decoder.quantize import make_scales
from mtl_decoder.saved import load_model

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "cached_only": (False, SmoothQuantSettings(all_per_token=False)),
    "top": (True, SmoothQuantSettings(all_per_token=False)),
    "top_per_token": (True, SmoothQuantSettings(all_per_token=True)),
}
"""Name -> (the top blocks int8, settings); per_token: every Linear's input quantised per token (--per-token all)."""


def refined_agreement(fp32: list[dict], int8: list[dict], tasks: dict[str, str], margin: float) -> dict:
    """``agreement`` once the texts within ``margin`` of a tie take float32's prediction, as --precision int8 does."""
    classify = [t for t, kind in tasks.items() if kind != TAGGING]
    merged = [
        a if close_to_a_tie([b[t]["probs"] for t in classify], margin) else b for a, b in zip(fp32, int8, strict=True)
    ]
    return agreement(fp32, merged, tasks)


def run_variant(model_dir: str, name: str, items: list, calibration: int, cache_dir: Path) -> list[dict]:
    top, settings = VARIANTS[name]
    saved = load_model(model_dir, "cpu")
    use_smoothing(saved.model, make_scales(saved, calibration, settings, cache_dir, top=top), settings)
    return list(predict_texts(saved, items, precision="int8", cache_dir=cache_dir, refine=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a hybrid model folder (RUN/best) that quantize has run on")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--calibration-texts", type=int, default=512)
    parser.add_argument("--data-root", default=str(default_data_root()))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "w8a8_top_ablation.json"))
    args = parser.parse_args(argv)
    items, gold_tags, gold_labels = load_items(Path(args.data_root))
    tasks = {t.name: t.kind for t in load_model(args.model, "cpu").model.tasks}
    margin = load_scales(Path(args.model) / SCALES_FILE)[2].get("refine_margin", 0.0)
    result = {"benchmark": "w8a8_top_ablation", "model": args.model, "cpu": cpu_name(), "sentences": len(items),
              "calibration_texts": args.calibration_texts, "refine_margin": margin, **machine()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ablation-states-") as cache:
        fp32 = list(predict_texts(args.model, items, precision="fp32", cache_dir=cache))
        result["fp32"] = {"test": test_metrics(fp32, tasks, gold_tags, gold_labels)}
        for name in args.variants.split(","):
            int8 = run_variant(args.model, name, items, args.calibration_texts, Path(cache))
            result[name] = {
                "agreement_alone": agreement(fp32, int8, tasks),
                "agreement_refined": refined_agreement(fp32, int8, tasks, margin),
                "test_alone": test_metrics(int8, tasks, gold_tags, gold_labels),
            }
            print(name, json.dumps(result[name]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
