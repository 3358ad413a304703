"""``export``: a saved model's pretrained trunk as a Hugging Face checkpoint, or a native model as an ONNX graph."""

from __future__ import annotations

import argparse

from mtl_decoder.errors import UserError


def run_export(args: argparse.Namespace) -> None:
    if args.format == "onnx":
        from mtl_decoder.export_onnx import export_onnx

        if args.trunk or args.expert:
            raise UserError("export --format onnx writes the whole model: leave out --trunk and --expert")
        print(export_onnx(args.model, args.output, force=args.force).report())
        return
    from mtl_decoder.export import export_trunk

    if not args.trunk:
        raise UserError(
            "export: say what to export: --trunk (a pretrained trunk as a Hugging Face checkpoint) or --format onnx "
            "(a native model as an ONNX graph)"
        )
    print(export_trunk(args.model, args.output, expert=args.expert, force=args.force).report())


def add_export(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a pretrained trunk as a Hugging Face checkpoint, or a native model as an ONNX graph",
        description="Write the (fine-tuned) pretrained trunk of a saved model as a standard checkpoint that "
        "transformers' AutoModelForCausalLM.from_pretrained loads: each block gets the MLP of one expert. With "
        "--format onnx: a native model's folder with its ONNX graph (model.onnx), checked against the torch model on "
        "the validation texts, for predict and evaluate --engine onnx (needs pip install 'mtl-decoder[onnx]').",
    )
    p.add_argument(
        "--model",
        required=True,
        help="model directory (RUN/best): with a pretrained trunk (--trunk), or a native model (--format onnx)",
    )
    p.add_argument("--trunk", action="store_true", help="export the pretrained trunk as a Hugging Face checkpoint")
    p.add_argument(
        "--format",
        choices=["hf", "onnx"],
        default="hf",
        help="hf (default): the trunk as a Hugging Face checkpoint (with --trunk); onnx: a native model as an ONNX "
        "graph, refused when it disagrees with the torch model on the validation texts",
    )
    p.add_argument("--output", required=True, help="output folder")
    p.add_argument(
        "--expert",
        help="the expert whose MLP every block gets: shared/I or TASK/I (default shared/0; modes upcycle and lora)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.set_defaults(func=run_export)
