"""The command line: a thin map from subcommands to plain functions; every adapter lives here.

    mtl-decoder train    --config C [--output-dir DIR] [--resume | --overwrite] [key=value ...]
    mtl-decoder distill  --teacher RUN/best --config C [--unlabelled FILE]... [--output-dir DIR] [key=value ...]
    mtl-decoder evaluate --model RUN/best [--split test] [--tasks a,b] [--data TASK=PATH ...] [--output DIR]
    mtl-decoder predict  --model RUN/best --input FILE --output OUT.jsonl [--tasks a,b] [--on-error skip] [--force]
                         [--gate-table TABLE] [--shard K/N]
                         | --stream --input FILE_OR_- --output FILE_OR_- [--lookahead N]
    mtl-decoder merge-predictions OUT PART... [--force]      (the parts of predict --shard K/N, in input order)
    mtl-decoder build-gate-table --model RUN/best --input FILE --output TABLE [--buckets N] [--threshold T]
    mtl-decoder debug-data --config C [--json] [key=value ...]         (exit 1 when the data has errors)
    mtl-decoder diagnose (--model RUN/best | --checkpoints RUN) [--data TASK=PATH ...] [--output DIR]
    mtl-decoder overfit  --config C [--steps N] [--threshold X]        (exit 1 unless one batch is fit and saved)
    mtl-decoder export   --model RUN/best --trunk --output DIR [--expert shared/0] [--force]

User errors (bad config, bad data, missing files) print one line and exit with status 2, no traceback; so does a
predict run in which every record failed (after its summary), and an operating-system error no closer layer named
(a full disk, a lost mount). SIGTERM during train, evaluate or predict removes what was being written, prints one
line and exits with 143.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from mtl_decoder.errors import UserError
from mtl_decoder.files import Terminated, os_reason, terminate_unwinds
from mtl_decoder.processes import is_main_process


def run_train(args: argparse.Namespace) -> None:
    from mtl_decoder.config import load_config
    from mtl_decoder.training import train

    config = load_config(args.config, args.overrides)
    train(config, output_dir=args.output_dir, resume=args.resume, overwrite=args.overwrite)


def run_distill(args: argparse.Namespace) -> None:
    from mtl_decoder.config import load_config
    from mtl_decoder.distill import distill

    config = load_config(args.config, args.overrides)
    distill(
        config,
        teacher=args.teacher,
        unlabelled=args.unlabelled,
        output_dir=args.output_dir,
        resume=args.resume,
        overwrite=args.overwrite,
    )


def run_evaluate(args: argparse.Namespace) -> None:
    """Evaluate, then print the notes, where the outputs went and the per-task table."""
    from mtl_decoder.evaluation.evaluate import METRICS_FILE, PLOTS_DIR, REPORT_FILE, evaluate
    from mtl_decoder.evaluation.report import task_table

    with terminate_unwinds():  # SIGTERM: the outputs being written are removed, none is left half-made
        result = evaluate(
            args.model,
            split=args.split,
            tasks=args.tasks,
            data=args.data or None,
            output_dir=args.output,
            batch_size=args.batch_size,
            precision=args.precision,
            cache_states=args.cache_states,
            cache_dir=args.cache_dir,
        )
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


def run_predict(args: argparse.Namespace) -> None:
    """predict_file with the command's flags, then the summary; with --stream, stream_file (summary on stderr)."""
    from mtl_decoder.prediction import predict_file

    if args.stream:
        from mtl_decoder.inference.streaming import stream_file
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
            args.model,
            args.input,
            args.output,
            args.tasks,
            args.lookahead,
            args.context,
            force=args.force,
            gate_table=args.gate_table,
        )
        print(stats.report(), file=sys.stderr)
        return
    to_stdout = args.output == "-"  # predictions on stdout, so the summary goes to stderr
    summary = predict_file(
        args.model,
        args.input,
        "/dev/stdout" if to_stdout else args.output,
        tasks=args.tasks,
        fmt=args.format,
        text_column=args.text_column,
        batch_size=args.batch_size,
        on_error=args.on_error,
        force=args.force,
        precision=args.precision,
        workers=args.workers,
        gate_table=args.gate_table,
        shard=args.shard,
        cache_states=args.cache_states,
        cache_dir=args.cache_dir,
    )
    if not is_main_process():  # under a launcher the main process reports for all
        return
    print(summary.report(), file=sys.stderr if to_stdout else sys.stdout)
    if summary.all_failed:  # a run that predicted nothing is a failed run, even in skip mode
        raise UserError(f"{args.input}: none of its {summary.read:,} records could be predicted (see {summary.errors})")


STREAM_IGNORES = {  # predict flag -> (its attribute, its default): what --stream has no use for
    "--batch-size": ("batch_size", 64),
    "--workers": ("workers", None),
    "--precision": ("precision", "fp32"),
    "--on-error": ("on_error", "fail"),
    "--format": ("format", None),
    "--text-column": ("text_column", "text"),
    "--cache-states": ("cache_states", False),
    "--cache-dir": ("cache_dir", None),
}


def stream_ignored_flags(args: argparse.Namespace) -> list[str]:
    """The predict flags given a value of their own that --stream would not honour."""
    return [flag for flag, (name, default) in STREAM_IGNORES.items() if getattr(args, name, default) != default]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mtl-decoder", description="Multi-task PLE decoder: train, evaluate, predict."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_train(sub)
    add_distill(sub)
    add_evaluate(sub)
    add_predict(sub)
    add_merge_predictions(sub)
    add_build_gate_table(sub)
    add_debug_data(sub)
    add_diagnose(sub)
    add_overfit(sub)
    add_export(sub)
    return parser


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
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. distill.temperature=4")
    p.set_defaults(func=run_distill)


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
    p.add_argument("--output", help="output directory (default: MODEL/eval-SPLIT)")
    p.add_argument("--batch-size", type=int, help="examples per batch")
    add_precision_flag(p)
    add_state_cache_flags(p)
    p.set_defaults(func=run_evaluate)


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
    p.add_argument("--batch-size", type=int, default=64, help="examples per batch (default: 64)")
    p.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="fail (default): stop at the first bad record; skip: write it to OUT.errors.jsonl",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    add_precision_flag(p)
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
        "threshold (opt-in; approximate: see the README for what it costs and saves)",
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


def run_build_gate_table(args: argparse.Namespace) -> None:
    """Read the sample's records (a bad one stops with file:line), build the table, write it, say where."""
    from mtl_decoder.errors import DataError
    from mtl_decoder.inference.gate_table import build_gate_table, table_paths
    from mtl_decoder.prediction.inputs import BadRecord, InputReader
    from mtl_decoder.saved import load_model

    reader = InputReader(args.input, args.format, args.text_column)
    tensors, meta = table_paths(args.output)
    for target in (tensors, meta):
        if target.exists() and not args.force:
            raise UserError(f"{target}: already exists (use --force to overwrite)")

    def items():
        for record in reader:
            if isinstance(record, BadRecord):
                raise DataError(reader.path, record.line, record.reason, record.field)
            yield record.item

    saved = load_model(args.model)
    table = build_gate_table(
        saved,
        items(),
        buckets=args.buckets,
        threshold=args.threshold,
        edge_margin=args.edge_margin,
        batch_size=args.batch_size,
        sample={"input": str(args.input)},
    )
    written = table.save(args.output)
    print(
        f"gate table of {len(table.entries)} gates, {table.buckets} buckets, from {table.sample['records']:,} "
        f"records ({table.sample['tokens']:,} tokens); threshold {table.threshold}, edge margin {table.edge_margin}"
    )
    print(f"wrote {written[0]} and {written[1]}")


def add_build_gate_table(sub) -> None:
    from mtl_decoder.data.formats import PREDICTION_FORMATS
    from mtl_decoder.inference.gate_table import DEFAULT_BUCKETS, DEFAULT_EDGE_MARGIN, DEFAULT_THRESHOLD

    p = sub.add_parser(
        "build-gate-table",
        help="cache a model's gate weights by input norm (for predict --gate-table)",
        description="Run a sample of inputs through a model; per layer and gate, bucket the tokens by the norm of "
        "the gate's input and keep each bucket's mean gate weights. Writes TABLE.safetensors and TABLE.json.",
    )
    p.add_argument("--model", required=True, help="model directory (RUN/best)")
    p.add_argument("--input", required=True, help="sample: " + " ".join(f".{f}" for f in PREDICTION_FORMATS))
    p.add_argument("--output", required=True, metavar="TABLE", help="table path (TABLE.safetensors + TABLE.json)")
    p.add_argument("--format", choices=list(PREDICTION_FORMATS), help="input format (default: from the suffix)")
    p.add_argument("--text-column", default="text", help="text column of .csv/.tsv input (default: text)")
    p.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS, help="norm buckets per gate (default %(default)s)")
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="skip an expert whose cached weight is under this (default %(default)s)",
    )
    p.add_argument(
        "--edge-margin",
        type=float,
        default=DEFAULT_EDGE_MARGIN,
        help="run the real gate for a token this share of its bucket's width from an inner edge (default "
        "%(default)s; 0.5: for every token, so that only the skipped experts approximate)",
    )
    p.add_argument("--batch-size", type=int, help="examples per batch (default: the run's data.eval_batch_size)")
    p.add_argument("--force", action="store_true", help="overwrite an existing table")
    p.set_defaults(func=run_build_gate_table)


def add_precision_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16", "int8"],
        default="fp32",
        help="fp32 (default), or the model under bf16 / fp16 autocast: faster on hardware with half-precision "
        "matrix units, close to but not identical to fp32; fp16 is for GPUs; int8: dynamic int8 Linear modules "
        "(native models and frozen trunks, the trunk's down_proj kept fp32), for CPUs",
    )


def add_state_cache_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="frozen trunk: the state cache's root folder (default: the model's model.trunk.cache_dir, else "
        "$MTL_DECODER_CACHE/states, else ~/.cache/mtl-decoder/states)",
    )
    p.add_argument(
        "--cache-states",
        action="store_true",
        help="frozen trunk: also write the states of new texts to the cache folder (default: only read it; at "
        "most a bounded number of states is kept in memory either way)",
    )


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
    """diagnose a model (or a run's checkpoints), then the findings and where the report went; status 1 on an
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


def main(argv: list[str] | None = None, run: Callable | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = (run or args.func)(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as err:  # SIGTERM during train, evaluate or predict: their temporary files are gone
        print(str(err) if str(err) != "terminated by SIGTERM" else "terminated", file=sys.stderr)
        return Terminated.exit_code
    except OSError as err:  # the environment (a full disk, a lost mount) where no closer layer named it
        where = f"{err.filename}: " if err.filename is not None else ""
        print(f"error: {where}{os_reason(err)}", file=sys.stderr)
        return 2
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
