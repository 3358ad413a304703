"""``predict`` (files, shards, ``--stream``) and ``merge-predictions`` (a sharded job's parts back into one output)."""

from __future__ import annotations

import argparse
import sys

from mtl_decoder.commands.flags import (
    add_engine_flag,
    add_max_tokens_flag,
    add_pack_tokens_flag,
    add_precision_flag,
    add_refine_flag,
    add_state_cache_flags,
)
from mtl_decoder.errors import UserError
from mtl_decoder.files import STDOUT
from mtl_decoder.inference.options import BATCH_SIZE, PRECISION
from mtl_decoder.processes import is_main_process


def run_predict(args: argparse.Namespace) -> None:
    """predict_file with the command's flags, then the summary; with --stream, stream_file (summary on stderr)."""
    from mtl_decoder.inference import InferenceOptions
    from mtl_decoder.prediction import predict_file

    options = InferenceOptions.from_args(args).checked(flags=True)  # before any model loads
    if args.stream:
        from mtl_decoder.prediction.stream import stream_file
        from mtl_decoder.processes import launched

        if args.shard is not None or launched():
            raise UserError("--stream reads one text in one process: leave out --shard and the launcher")
        ignored = stream_ignored_flags(args)
        if ignored:  # a flag that would do nothing is refused, not dropped silently
            raise UserError(
                f"--stream runs one growing text through per-layer caches: {', '.join(ignored)} "
                "do(es) not apply to it; leave them out"
            )

        stats = stream_file(
            args.model, args.input, args.output, args.tasks, args.lookahead, args.context, force=args.force,
            options=options,
        )  # fmt: skip
        print(stats.report(), file=sys.stderr)
        return
    to_stdout = args.output == "-"  # predictions on stdout, so the summary goes to stderr
    summary = predict_file(
        args.model,
        args.input,
        STDOUT if to_stdout else args.output,
        tasks=args.tasks,
        fmt=args.format,
        text_column=args.text_column,
        on_error=args.on_error,
        force=args.force,
        shard=args.shard,
        options=options,
    )
    if not is_main_process():  # under a launcher the main process reports for all
        return
    print(summary.report(), file=sys.stderr if to_stdout else sys.stdout)
    if summary.all_failed:  # a run that predicted nothing is a failed run, even in skip mode
        raise UserError(f"{args.input}: none of its {summary.read:,} records could be predicted (see {summary.errors})")


STREAM_IGNORES = {  # predict flag -> (its attribute, its default): what --stream has no use for
    "--batch-size": ("batch_size", BATCH_SIZE),
    "--workers": ("workers", None),
    "--precision": ("precision", PRECISION),
    "--on-error": ("on_error", "fail"),
    "--format": ("format", None),
    "--text-column": ("text_column", "text"),
    "--cache-states": ("cache_states", False),
    "--cache-dir": ("cache_dir", None),
    "--max-tokens": ("max_tokens", None),
    "--pack-tokens": ("pack_tokens", None),
    "--no-refine": ("refine", True),
    "--engine": ("engine", "torch"),
}


def stream_ignored_flags(args: argparse.Namespace) -> list[str]:
    """The predict flags given a value of their own that --stream would not honour."""
    return [flag for flag, (name, default) in STREAM_IGNORES.items() if getattr(args, name, default) != default]


def add_predict(sub) -> None:
    from mtl_decoder.data.formats import PREDICTION_FORMATS

    p = sub.add_parser("predict", help="batch prediction on files", description="Predict on a file, streaming.")
    p.add_argument("--model", required=True, help="model directory (RUN/best)")
    p.add_argument(
        "--input",
        required=True,
        help="input file: " + " ".join(f".{f}" for f in PREDICTION_FORMATS) + ", or - for stdin (with --format; "
        "with --stream: any text)",
    )
    p.add_argument(
        "--output", required=True, help="output .jsonl, - for stdout; a device or named pipe is written through"
    )
    p.add_argument("--format", choices=list(PREDICTION_FORMATS), help="input format (default: from the suffix)")
    p.add_argument("--text-column", default="text", help="text column of .csv/.tsv input (default: text)")
    p.add_argument("--tasks", help="comma-separated task names (default: all)")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE, help=f"examples per batch (default: {BATCH_SIZE})")
    p.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="fail (default): stop at the first bad record; skip: write it to OUT.errors.jsonl",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    add_precision_flag(p)
    add_max_tokens_flag(p)
    add_pack_tokens_flag(p)
    add_refine_flag(p)
    add_engine_flag(p)
    p.add_argument(
        "--workers",
        type=int,
        help="threads running batches side by side, each with its share of torch's threads (default: 1 for a "
        "pretrained trunk, which uses all of torch's threads; else 2 where torch has 2 or more threads or a GPU is "
        "used, else 1)",
    )
    add_state_cache_flags(p)
    p.add_argument(
        "--stream",
        action="store_true",
        help="causal models: the input is one continuous text, read as it arrives (stdin line by line); one JSON "
        "line per word (word, start, end, tags) as soon as its tags are final, through a KV cache",
    )
    p.add_argument(
        "--lookahead",
        type=int,
        default=2,
        help="--stream with a CRF: emit a word once N more words have arrived, from the Viterbi path of the words "
        "not yet emitted (0: at once; larger: closer to whole-text Viterbi, later); default 2",
    )
    p.add_argument(
        "--context",
        type=int,
        help="--stream past data.max_length: restart from the last N tokens (default: half the maximum length)",
    )
    p.add_argument(
        "--gate-table",
        metavar="TABLE",
        help="read gate weights from a table made by build-gate-table and skip the experts it leaves under its "
        "threshold (opt-in; approximate: see docs/diagnostics.md for what it costs and saves)",
    )
    p.add_argument(
        "--shard",
        metavar="K/N",
        help="predict only shard K of N (0 <= K < N: blocks of 16 batches of records, block b to shard b mod N) into "
        "a part file carrying each record's input line; join the N parts with merge-predictions",
    )
    p.set_defaults(func=run_predict)


def run_merge_predictions(args: argparse.Namespace) -> None:
    from mtl_decoder.prediction.parts import merge_predictions

    summary = merge_predictions(args.output, args.parts, force=args.force)
    print(f"merged {len(args.parts)} parts (seconds: the parts' prediction time, summed)")
    print(summary.report())


def add_merge_predictions(sub) -> None:
    p = sub.add_parser(
        "merge-predictions",
        help="join the parts of predict --shard K/N into one output",
        description="Put the N parts written by predict --shard K/N back into one output in input order (and "
        "OUT.errors.jsonl for --on-error skip parts), checking that every record is there exactly once.",
    )
    p.add_argument("output", metavar="OUT", help="output .jsonl")
    p.add_argument("parts", metavar="PART", nargs="+", help="the part files, all N of them, in any order")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=run_merge_predictions)
