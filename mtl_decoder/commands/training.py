"""``train`` and ``distill``: a run folder from an experiment config (and a teacher)."""

from __future__ import annotations

import argparse


def run_train(args: argparse.Namespace) -> None:
    from mtl_decoder.config import load_config
    from mtl_decoder.training.trainer import run_training

    config = load_config(args.config, args.overrides)
    run_training(config, output_dir=args.output_dir, resume=args.resume, overwrite=args.overwrite)


def run_distill(args: argparse.Namespace) -> None:
    from mtl_decoder.config import load_config
    from mtl_decoder.distill import distill

    config = load_config(args.config, args.overrides)
    if args.label_only:
        label_only_command(args, config)
        return
    distill(
        config,
        teacher=args.teacher,
        unlabelled=args.unlabelled,
        output_dir=args.output_dir,
        resume=args.resume,
        overwrite=args.overwrite,
    )


def label_only_command(args: argparse.Namespace, config) -> None:
    from accelerate import PartialState

    from mtl_decoder.distill.prelabel import label_only
    from mtl_decoder.errors import UserError

    for flag, given in (("--output-dir", args.output_dir), ("--resume", args.resume), ("--overwrite", args.overwrite)):
        if given:
            raise UserError(f"distill --label-only writes no run folder: leave out {flag}")
    counts = label_only(config, teacher=args.teacher, unlabelled=args.unlabelled, progress=config.training.progress)
    if PartialState().is_main_process:
        print(counts["line"])


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train on multi-task data", description="Train a multi-task model.")
    p.add_argument("--config", required=True, help="experiment YAML (e.g. configs/demo.yaml)")
    p.add_argument("--output-dir", help="run directory (default: training.output_dir)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run directory")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in a run directory that is not empty (it lists what it removes)",
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. model.d_model=64")
    p.set_defaults(func=run_train)


def add_distill(sub) -> None:
    p = sub.add_parser(
        "distill",
        help="train a student on a teacher model's soft targets",
        description="Distil a saved teacher into a student config: the teacher labels the training texts and the "
        "unlabelled files once (targets cached), the student learns from its soft targets and the gold labels.",
    )
    p.add_argument("--teacher", help="the teacher's saved model folder, e.g. RUN/best (default: distill.teacher)")
    p.add_argument("--config", required=True, help="the student's experiment YAML")
    p.add_argument(
        "--unlabelled",
        action="append",
        metavar="FILE",
        help="unlabelled texts for the transfer set, in any format predict reads; repeat the flag for more files",
    )
    p.add_argument("--output-dir", help="run directory (default: training.output_dir)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run directory")
    p.add_argument("--overwrite", action="store_true", help="start over in a run directory that is not empty")
    p.add_argument(
        "--label-only",
        action="store_true",
        help="only fill the target cache with the teacher's targets (every process of a launch its share), no run; "
        "a later distill run with the same teacher and texts finds them there and only trains",
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. distill.temperature=4")
    p.set_defaults(func=run_distill)
