"""How SmoothQuant's migration strengths set W8A8's agreement with float32 on a trained model (issue 36 item 1):
``mtl-decoder quantize``'s own check, for several (alpha, down_alpha), calibrated once.

    python benchmarks/smoothquant_alpha.py [--model benchmarks/runs/smollm2_frozen_ple/best] [--settings 0.8:0.5,...]

For each setting: the scales from one calibration (512 training texts, as quantize makes them), then every
validation text predicted in float32 and in W8A8 through the same Predictor path; per task the share of texts whose
tags / label are float32's (quantize refuses under 98% / 99%). Writes benchmarks/results/smoothquant_alpha.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from bench_timing import cpu_name

from mtl_decoder import quantize as job
from mtl_decoder.export_onnx import validation_texts
from mtl_decoder.inference.smoothquant import SmoothQuantSettings, calibrate, smoothing_scales
from mtl_decoder.saved import load_model

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=HERE / "runs" / "smollm2_frozen_ple" / "best")
    parser.add_argument("--settings", default="0.8:0.5,0.9:0.5,0.7:0.5,0.95:0.5,0.8:0.3,0.8:0.7")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "smoothquant_alpha.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    saved = load_model(args.model, "cpu")
    base = saved.model.trunk_kind.cached_states().base
    amax = calibrate(base, job._calibration_batches(saved, 512))
    texts = validation_texts(saved)
    rows = []
    for pair in args.settings.split(","):
        alpha, down = (float(v) for v in pair.split(":"))
        settings = SmoothQuantSettings(alpha=alpha, down_alpha=down)
        start = time.process_time()
        agreement = job._agreement(saved, args.model, smoothing_scales(base, amax, settings), settings, texts, None)
        rows.append({"alpha": alpha, "down_alpha": down, "agreement": agreement,
                     "cpu_seconds": round(time.process_time() - start, 1)})  # fmt: skip
        print(rows[-1], flush=True)
    result = {"benchmark": "smoothquant_alpha", "model": str(args.model), "cpu": cpu_name(), "threads": 1,
              "validation_texts": len(texts), "calibration_texts": 512, "rows": rows}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
