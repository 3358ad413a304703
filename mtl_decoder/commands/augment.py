"""``augment``: altered copies of unlabelled texts, more transfer text for ``distill --unlabelled``."""

from __future__ import annotations

import argparse
from pathlib import Path


def run_augment(args: argparse.Namespace) -> None:
    from mtl_decoder.distill.augment import AugmentCounts, AugmentSpec, augment, words_of
    from mtl_decoder.distill.data import read_unlabelled
    from mtl_decoder.errors import UserError
    from mtl_decoder.files import AtomicFile

    spec = AugmentSpec(
        copies=args.copies,
        drop=args.drop,
        swap=args.swap,
        ngram=args.ngram,
        max_ngram=args.max_ngram,
        seed=args.seed,
    )
    output = Path(args.output)
    if any(output.resolve() == Path(p).resolve() for p in args.input):
        raise UserError(f"--output {output}: is one of the inputs")
    if output.exists() and not args.force:
        raise UserError(f"{output}: already exists (use --force to overwrite)")
    texts = [words_of(item) for _, items in read_unlabelled(args.input, None) for item in items]
    counts = AugmentCounts()
    # nothing at --output until every copy is written; without --force a file that appears meanwhile is kept
    with AtomicFile(output, replace=args.force) as out:
        if args.keep_inputs:  # the texts first, then their copies: one file, one source of the transfer set
            for words in texts:
                out.write_line(" ".join(words))
        for copy in augment(texts, spec, counts):
            out.write_line(copy)
        out.commit()
    print(
        f"augment: {counts.written:,} copies of {counts.texts:,} texts written to {output}"
        + (" after the texts themselves" if args.keep_inputs else "")
        + (f"; {counts.duplicates:,} left out, every draw already seen" if counts.duplicates else "")
    )


def add_augment(sub) -> None:
    p = sub.add_parser(
        "augment",
        help="write altered copies of unlabelled texts (more transfer text for distill)",
        description="Write altered copies of texts, one per line, for distill --unlabelled: each word dropped or "
        "swapped for a word of its shape, each copy maybe cut to an n-gram (Tang et al. 2019). The teacher labels "
        "them when the student is distilled.",
    )
    p.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="FILE",
        help="texts in any format predict reads; repeat the flag for more files",
    )
    p.add_argument("--output", required=True, help="the copies, one text per line (.txt)")
    p.add_argument("--copies", type=int, default=1, help="altered copies per text (default 1)")
    p.add_argument("--drop", type=float, default=0.1, help="chance that a word is dropped (default 0.1)")
    p.add_argument(
        "--swap",
        type=float,
        default=0.1,
        help="chance that a word is swapped for one of its shape, drawn by frequency (default 0.1)",
    )
    p.add_argument(
        "--ngram",
        type=float,
        default=0.25,
        help="chance that a copy is cut to a run of 1 to --max-ngram words (default 0.25)",
    )
    p.add_argument("--max-ngram", type=int, default=5, help="the longest run a cut keeps (default 5)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--keep-inputs",
        action="store_true",
        help="write the input texts first, then the copies: one file that replaces the inputs",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=run_augment)
