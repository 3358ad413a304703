"""``evaluate``: per-task metrics and expert utilisation of a saved model."""

from __future__ import annotations

import argparse

from mtl_decoder.commands.flags import (
    add_engine_flag,
    add_max_tokens_flag,
    add_pack_tokens_flag,
    add_precision_flag,
    add_refine_flag,
    add_state_cache_flags,
)
from mtl_decoder.processes import is_main_process
from mtl_decoder.termination import terminate_unwinds


def run_evaluate(args: argparse.Namespace) -> None:
    """Evaluate, then print the notes, where the outputs went and the per-task table."""
    from mtl_decoder.evaluation.evaluate import METRICS_FILE, PLOTS_DIR, REPORT_FILE, evaluate
    from mtl_decoder.evaluation.report import task_table
    from mtl_decoder.inference import InferenceOptions

    options = InferenceOptions.from_args(args).checked(flags=True)  # before any model loads
    with terminate_unwinds():  # SIGTERM: the outputs being written are removed, none is left half-made
        result = evaluate(
            args.model, split=args.split, tasks=args.tasks, data=args.data or None, output_dir=args.output,
            options=options, train_data=args.train_data or None,
        )  # fmt: skip
    if not is_main_process():  # under a launcher the main process reports for all
        return
    for note in result.metrics["notes"]:
        print(f"note: {note}")
    if result.states is not None:
        s = result.states
        print(
            f"trunk states: {s['computed']:,} texts computed, {s['cached']:,} from the state cache, "
            f"{s['repeated']:,} repeats inside the data"
        )
    print(f"wrote {result.output_dir / METRICS_FILE}, {REPORT_FILE} and {PLOTS_DIR}/")
    print()
    print("\n".join(task_table(result.metrics)))


def add_evaluate(sub) -> None:
    p = sub.add_parser(
        "evaluate",
        help="per-task metrics and expert utilisation",
        description="Evaluate a saved model on a split or on given files.",
    )
    p.add_argument("--model", required=True, help="model directory (RUN/best)")
    p.add_argument("--split", default="test", help="split named in the run's task files (default: test)")
    p.add_argument("--tasks", help="comma-separated task names (default: all)")
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="TASK=PATH",
        help="evaluate TASK on PATH (read with the task's columns) instead of its split; repeatable; "
        "without --tasks only the tasks given here are evaluated",
    )
    p.add_argument(
        "--train-data",
        action="append",
        default=[],
        metavar="TASK=PATH",
        help="training file of a tagging TASK whose entities count as seen, for F1 on entities seen and unseen in "
        "training (default: the run's own train file, where it is still there); repeatable",
    )
    p.add_argument("--output", help="output directory (default: MODEL/eval-SPLIT)")
    p.add_argument("--batch-size", type=int, help="examples per batch")
    add_precision_flag(p)
    add_max_tokens_flag(p)
    add_pack_tokens_flag(p)
    add_refine_flag(p)
    add_engine_flag(p)
    add_state_cache_flags(p)
    p.set_defaults(func=run_evaluate)
