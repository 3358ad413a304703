"""``build-gate-table``: a model's gate weights cached by input norm, for ``predict --gate-table``."""

from __future__ import annotations

import argparse

from mtl_decoder.errors import UserError
from mtl_decoder.paths import check_outside_model


def run_build_gate_table(args: argparse.Namespace) -> None:
    """Read the sample's records (a bad one stops with file:line), build the table, write it, say where."""
    from mtl_decoder.data.inputs import BadRecord, InputReader
    from mtl_decoder.errors import DataError
    from mtl_decoder.inference.gate_build import build_gate_table
    from mtl_decoder.inference.gate_table import table_paths
    from mtl_decoder.saved import load_model

    reader = InputReader(args.input, args.format, args.text_column)
    tensors, meta = table_paths(args.output)
    for target in (tensors, meta):
        check_outside_model(target, args.model)
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
