"""``debug-data``, ``diagnose`` and ``overfit``: checks of data, model and setup.

``debug-data``, ``diagnose`` and ``overfit``: checks of the data, of a trained model and of the training setup;
each exits with status 1 when what it checks fails."""

from __future__ import annotations

import argparse


def run_debug_data(args: argparse.Namespace) -> int:
    """debug_data on the config: the report (or its JSON) on stdout; status 1 when the data has errors."""
    import json

    from mtl_decoder.config import load_config
    from mtl_decoder.diagnostics.data import debug_data
    from mtl_decoder.diagnostics.data_report import data_report_lines

    report = debug_data(load_config(args.config, args.overrides), args.max_overlap, args.max_mislabelled)
    print(json.dumps(report.to_json(), indent=2) if args.json else "\n".join(data_report_lines(report)))
    return 0 if report.ok else 1


def run_diagnose(args: argparse.Namespace) -> int:
    """Run ``diagnose`` and report its findings.

    diagnose a model (or a run's checkpoints), then the findings and where the report went; status 1 on an
    error-level finding."""
    from mtl_decoder.diagnostics.model import diagnose, diagnose_checkpoints

    options = {"data": args.data or None, "split": args.split, "output_dir": args.output, "examples": args.examples}
    result = diagnose_checkpoints(args.checkpoints, **options) if args.checkpoints else diagnose(args.model, **options)
    print("\n".join(result.summary_lines()))
    return 0 if result.ok else 1


def run_overfit(args: argparse.Namespace) -> int:
    """overfit on the config; status 1 unless every task fits and the saved model reproduces the predictions."""
    from mtl_decoder.config import load_config
    from mtl_decoder.diagnostics.overfit import overfit

    result = overfit(
        load_config(args.config, args.overrides),
        steps=args.steps,
        threshold=args.threshold,
        examples=args.examples,
        lr=args.lr,
    )
    print("\n".join(result.summary_lines()))
    return 0 if result.passed else 1


def add_debug_data(sub) -> None:
    from mtl_decoder.diagnostics.defaults import MAX_MISLABELLED, MAX_OVERLAP

    p = sub.add_parser(
        "debug-data",
        help="check a config's task data before training",
        description="Statistics and problems of every task's data, ranked by how much they are likely to hurt; "
        "exit status 1 when there are errors.",
    )
    p.add_argument("--config", required=True, help="experiment YAML (e.g. configs/demo.yaml)")
    p.add_argument("--json", action="store_true", help="print one JSON object (a key per task, '@' keys for the rest)")
    p.add_argument(
        "--max-overlap",
        type=float,
        default=MAX_OVERLAP,
        help=f"share of a validation/test split that may repeat train exactly (default {MAX_OVERLAP})",
    )
    p.add_argument(
        "--max-mislabelled",
        type=float,
        default=MAX_MISLABELLED,
        help=f"share of a validation/test split that may repeat train with other labels (default {MAX_MISLABELLED})",
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. data.max_length=64")
    p.set_defaults(func=run_debug_data)


def add_diagnose(sub) -> None:
    from mtl_decoder.diagnostics.defaults import DIAGNOSE_EXAMPLES

    p = sub.add_parser(
        "diagnose",
        help="look inside a trained model",
        description="Sub-layer norms, attention entropy, expert saturation, gate balance, a padding-leak check and "
        "a profile of one forward pass; writes diagnose.md, diagnose.json and plots.",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="model directory (RUN/best)")
    which.add_argument("--checkpoints", metavar="RUN", help="a run directory: diagnose each of its checkpoints")
    p.add_argument("--split", default="validation", help="split the examples come from (default: validation)")
    p.add_argument("--data", action="append", default=[], metavar="TASK=PATH", help="read TASK's examples from PATH")
    p.add_argument("--output", help="output directory (default: MODEL/diagnose, or RUN/diagnose)")
    p.add_argument(
        "--examples", type=int, default=DIAGNOSE_EXAMPLES, help=f"examples per task (default {DIAGNOSE_EXAMPLES})"
    )
    p.set_defaults(func=run_diagnose)


def add_overfit(sub) -> None:
    from mtl_decoder.diagnostics import defaults

    p = sub.add_parser(
        "overfit",
        help="check the model can fit one small batch",
        description="Train on one small batch per task; exit status 1 unless every task's loss falls below the "
        "threshold and the saved model reproduces the predictions. Names the first thing that failed.",
    )
    p.add_argument("--config", required=True, help="experiment YAML (e.g. configs/demo.yaml)")
    p.add_argument("--steps", type=int, default=defaults.OVERFIT_STEPS, help="most steps (default %(default)s)")
    p.add_argument(
        "--threshold",
        type=float,
        default=defaults.OVERFIT_THRESHOLD,
        help="loss every task must fall below (default %(default)s)",
    )
    p.add_argument(
        "--examples", type=int, default=defaults.OVERFIT_EXAMPLES, help="train examples per task (default %(default)s)"
    )
    p.add_argument("--lr", type=float, default=defaults.OVERFIT_LR, help="constant learning rate (default %(default)s)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. model.d_model=64")
    p.set_defaults(func=run_overfit)
