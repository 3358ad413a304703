"""The command line: a thin map from subcommands to plain functions; every adapter lives here.

    mtl-decoder train    --config C [--output-dir DIR] [--resume | --overwrite] [key=value ...]
    mtl-decoder distill  --teacher RUN/best --config C [--unlabelled FILE]... [--output-dir DIR] [key=value ...]
                         | --label-only ...   (only the teacher's targets, into the cache: no run folder)
    mtl-decoder augment  --input FILE... --output OUT.txt [--copies N] [--seed S]   (more transfer text for distill)
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
    mtl-decoder quantize --model RUN/best [--calibration-texts 512] [--alpha 0.8]   (W8A8 scales for --precision int8)

User errors (bad config, bad data, missing files) print one line and exit with status 2, no traceback; so does a
predict run in which every record failed (after its summary), and an operating-system error no closer layer named
(a full disk, a lost mount). SIGTERM during train, evaluate or predict removes what was being written, prints one
line and exits with 143.
"""

from __future__ import annotations

import argparse
import sys
import unicodedata
from collections.abc import Callable

from mtl_decoder.commands.augment import add_augment
from mtl_decoder.commands.diagnostics import add_debug_data, add_diagnose, add_overfit
from mtl_decoder.commands.evaluate import add_evaluate
from mtl_decoder.commands.export import add_export
from mtl_decoder.commands.gate_table import add_build_gate_table
from mtl_decoder.commands.predict import add_merge_predictions, add_predict
from mtl_decoder.commands.quantize import add_quantize
from mtl_decoder.commands.training import add_distill, add_train
from mtl_decoder.errors import UserError
from mtl_decoder.files import os_reason
from mtl_decoder.termination import Terminated


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mtl-decoder", description="Multi-task PLE decoder: train, evaluate, predict."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_train(sub)
    add_distill(sub)
    add_augment(sub)
    add_evaluate(sub)
    add_predict(sub)
    add_merge_predictions(sub)
    add_build_gate_table(sub)
    add_debug_data(sub)
    add_diagnose(sub)
    add_overfit(sub)
    add_export(sub)
    add_quantize(sub)
    return parser


def printable(text: str) -> str:
    """Text with control and format characters escaped.

    ``text`` with control and format characters (U+202E and the other bidirectional overrides among them)
    written as escapes, so that a name read from a file shows as it is spelt and cannot reorder or hide the rest
    of the line; line breaks and tabs stay."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf") else ascii(ch)[1:-1] for ch in text
    )


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line with ``key=value`` overrides anywhere.

    The command line parsed, with ``key=value`` overrides taken wherever they stand among the flags (argparse
    alone keeps only those before the first flag after the positionals)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        overrides = [a for a in extra if "=" in a and not a.startswith("-")]
        if getattr(args, "overrides", None) is None or len(overrides) != len(extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *overrides]
    return args


def main(argv: list[str] | None = None, run: Callable | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        status = (run or args.func)(args)
    except UserError as err:
        print(f"error: {printable(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as err:  # SIGTERM during train, evaluate or predict: their temporary files are gone
        print(str(err) if str(err) != "terminated by SIGTERM" else "terminated", file=sys.stderr)
        return Terminated.exit_code
    except OSError as err:  # the environment (a full disk, a lost mount) where no closer layer named it
        where = f"{err.filename}: " if err.filename is not None else ""
        print(f"error: {printable(where + os_reason(err))}", file=sys.stderr)
        return 2
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
