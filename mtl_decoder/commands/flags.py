"""Flags several subcommands share, defined once.

The precision, the batches' token bound and a frozen trunk's state
cache."""

from __future__ import annotations

import argparse


def add_precision_flag(p: argparse.ArgumentParser) -> None:
    from mtl_decoder.inference.options import PRECISION, PRECISIONS  # the choices, stated where they are applied

    p.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        default=PRECISION,
        help="fp32 (default), or the model under bf16 / fp16 autocast: faster on hardware with half-precision "
        "matrix units, close to but not identical to fp32; fp16 is for GPUs; int8: dynamic int8 Linear modules "
        "(native models and frozen trunks, the trunk's down_proj kept fp32), for CPUs",
    )


def add_max_tokens_flag(p: argparse.ArgumentParser) -> None:
    from mtl_decoder.inference.options import MAX_TOKENS  # the defaults, stated where the options are

    p.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="padded sub-words a batch holds at most (its rows x its longest input), besides --batch-size rows, so "
        f"that a few long texts do not pad a whole batch (default: {MAX_TOKENS['pretrained']} for a pretrained "
        f"trunk, {MAX_TOKENS['native']} for a native model; 0: no token bound, rows only); predictions do not "
        "depend on it beyond float rounding",
    )


def add_pack_tokens_flag(p: argparse.ArgumentParser) -> None:
    from mtl_decoder.model.pretrained.packing import PACK_TOKENS  # the default, stated where packing is

    p.add_argument(
        "--pack-tokens",
        type=int,
        metavar="N",
        help="pretrained trunk: texts packed end to end into rows of at most N ids for the trunk's pass, so that it "
        f"multiplies no padding (default {PACK_TOKENS}; 0: padded batches); predictions do not depend on it beyond "
        "float rounding",
    )


def add_refine_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-refine",
        dest="refine",
        action="store_false",
        help="--precision int8 with a folder's W8A8 scales: skip the float32 pass over texts whose int8 label is "
        "within the margin mtl-decoder quantize chose (int8 alone: faster, a little further from float32)",
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


def add_engine_flag(p: argparse.ArgumentParser) -> None:
    from mtl_decoder.inference.options import ENGINES

    p.add_argument(
        "--engine",
        choices=list(ENGINES),
        default=ENGINES[0],
        help="torch (default), or onnx: the model folder's ONNX graph (from export --format onnx) on ONNX Runtime, "
        "same outputs within 1e-4; fp32 only (needs pip install 'mtl-decoder[onnx]')",
    )
