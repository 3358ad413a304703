"""``export``: a saved model's pretrained trunk as a Hugging Face checkpoint."""

from __future__ import annotations

import argparse

from mtl_decoder.errors import UserError


def run_export(args: argparse.Namespace) -> None:
    from mtl_decoder.export import export_trunk

    if not args.trunk:
        raise UserError("export: say what to export: --trunk (a pretrained trunk as a Hugging Face checkpoint)")
    print(export_trunk(args.model, args.output, expert=args.expert, force=args.force).report())


def add_export(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a pretrained trunk as a Hugging Face checkpoint",
        description="Write the (fine-tuned) pretrained trunk of a saved model as a standard checkpoint that "
        "transformers' AutoModelForCausalLM.from_pretrained loads: each block gets the MLP of one expert.",
    )
    p.add_argument("--model", required=True, help="model directory (RUN/best) with a pretrained trunk")
    p.add_argument("--trunk", action="store_true", help="export the trunk (the only kind of export)")
    p.add_argument("--output", required=True, help="output folder")
    p.add_argument(
        "--expert",
        help="the expert whose MLP every block gets: shared/I or TASK/I (default shared/0; modes upcycle and lora)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.set_defaults(func=run_export)
