"""``quantize``: SmoothQuant scales for a pretrained trunk's cached blocks, checked and kept in the model folder."""

from __future__ import annotations

import argparse


def run_quantize(args: argparse.Namespace) -> None:
    from mtl_decoder.inference.smoothquant import SmoothQuantSettings
    from mtl_decoder.quantize import quantize_model

    settings = SmoothQuantSettings(alpha=args.alpha, down_alpha=args.down_alpha, all_per_token=args.per_token == "all")
    result = quantize_model(
        args.model,
        calibration_texts=args.calibration_texts,
        check_texts=args.check_texts,
        settings=settings,
        min_tags=args.min_tags,
        min_labels=args.min_labels,
        cache_dir=args.cache_dir,
        refine_margin=args.refine_margin,
    )
    print(result.report())


def add_quantize(sub) -> None:
    from mtl_decoder.inference.refine import MARGINS
    from mtl_decoder.inference.smoothquant import SmoothQuantSettings
    from mtl_decoder.quantize import MIN_LABELS, MIN_TAGS

    p = sub.add_parser(
        "quantize",
        help="make W8A8 int8 scales for a pretrained trunk (used by --precision int8)",
        description="Calibrate SmoothQuant scales for the cached blocks of a model's pretrained trunk on its training "
        "texts, check int8 against float32 on its validation texts, and store the scales in the model folder "
        "(smoothquant.safetensors), after which predict and evaluate --precision int8 run every Linear of those "
        "blocks in int8, the texts whose int8 label is close to a tie predicted again in float32. Refused, with the "
        "numbers and nothing written, when fewer validation texts than --min-tags / --min-labels keep float32's "
        "tags / label even then.",
    )
    p.add_argument("--model", required=True, help="model directory (RUN/best) with a pretrained trunk")
    p.add_argument("--calibration-texts", type=int, default=512, help="training texts calibrated on (default 512)")
    p.add_argument("--check-texts", type=int, default=0, help="validation texts compared (default 0: all)")
    default = SmoothQuantSettings()  # the CLI's defaults are the settings' own
    p.add_argument(
        "--alpha",
        type=float,
        default=default.alpha,
        help=f"migration strength of q/k/v, o and gate/up (default {default.alpha})",
    )
    p.add_argument(
        "--down-alpha",
        type=float,
        default=default.down_alpha,
        help=f"migration strength of down_proj (default {default.down_alpha})",
    )
    per_token = "all" if default.all_per_token else "down_proj"
    p.add_argument(
        "--per-token",
        choices=["down_proj", "all"],
        default=per_token,
        help=f"the Linears whose input is quantised per token (default {per_token}; down_proj: the others per "
        "tensor, a little faster, a little further from float32)",
    )
    p.add_argument("--min-tags", type=float, default=MIN_TAGS, help=f"tagging bar (default {MIN_TAGS})")
    p.add_argument("--min-labels", type=float, default=MIN_LABELS, help=f"classification bar (default {MIN_LABELS})")
    p.add_argument(
        "--refine-margin",
        type=float,
        help="texts whose int8 label has its two most probable classes within this of each other are predicted "
        "again in float32 at --precision int8 (default: the smallest of "
        f"{', '.join(map(str, MARGINS))} at which the validation texts reach the bars; 0: int8 alone)",
    )
    p.add_argument("--cache-dir", help="the state cache's root (default: the model's)")
    p.set_defaults(func=run_quantize)
