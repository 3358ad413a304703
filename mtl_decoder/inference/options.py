"""How a saved model is run over new text: ``InferenceOptions``.

How a saved model is run over new text: ``InferenceOptions``, built once from a command's flags or a function's
keywords and checked before any model is loaded (``load_for_inference``, in loading.py, loads the model they run).

Each default and each list of choices is stated here once: ``BATCH_SIZE``, ``PRECISIONS``, ``MAX_TOKENS``.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from mtl_decoder.errors import UserError
from mtl_decoder.runtime import default_device

BATCH_SIZE = 64
"""Examples per batch of ``predict``, ``predict_texts`` and a Predictor (``evaluate``: the run's
data.eval_batch_size, the size training-time validation used)."""

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": None}
"""Inference precision -> the autocast dtype (None: no autocast; int8 quantises the model instead); the first is the
default."""
PRECISION = next(iter(PRECISIONS))

MAX_TOKENS = {"pretrained": 1024, "native": 2048}
"""Padded sub-words a batch holds at most (rows x its longest), by default, for a model with a pretrained trunk and
for a native one. A buffer's length-sorted pieces cut only every ``batch_size`` rows put its few long texts into one
batch with their shorter neighbours: a frozen SmolLM2 trunk spent 40% of its arithmetic on padding over 500
CoNLL-2003 test sentences (12% at 1024; benchmarks/results/pretrained_profile.json). Words per CPU-second against
rows only, 4 blocks, 1 thread: 1.48x on 500 sentences, 1.21x on 1,000 at 1024 (2048: 1.42x, 1.11x; 512: 1.18x on
1,000). A native model's batch costs more Python for its arithmetic: the pinned test model (width 32) on the 3,453
CoNLL-2003 test sentences predicts 0.92x as fast at 1024, 1.02x at 2048."""

ENGINES = ("torch", "onnx")
"""What runs the model: torch, or onnx (the folder's graph from export --format onnx, on ONNX Runtime, fp32 only)."""

FLAGS = {
    "batch_size": "--batch-size",
    "max_tokens": "--max-tokens",
    "workers": "--workers",
    "pack_tokens": "--pack-tokens",
    "refine": "--no-refine",
}
"""A setting's name in the commands' errors (a function's errors name its keyword)."""


@dataclass(frozen=True)
class InferenceOptions:
    """The settings of one inference run, whichever path runs it."""

    batch_size: int | None = BATCH_SIZE
    """Examples per batch at most; None: the saved run's data.eval_batch_size."""
    precision: str = PRECISION
    """A key of PRECISIONS: fp32, bf16 / fp16 autocast (fp16 on GPUs), or int8 (CPUs)."""
    workers: int | None = None
    """Threads running batches side by side (None: Predictor.default_workers)."""
    max_tokens: int | None = None
    """Padded sub-words a batch holds at most (None: MAX_TOKENS of the model's kind; 0: rows only)."""
    pack_tokens: int | None = None
    """A pretrained trunk's pass: texts packed end to end into rows of at most this many ids (None: the trunk's
    default, model/pretrained/packing.PACK_TOKENS; 0: padded batches)."""
    cache_states: bool = False
    """A frozen trunk: also write the states of new texts to its cache folder."""
    cache_dir: str | Path | None = None
    """A frozen trunk: the state cache's root (None: the model's model.trunk.cache_dir, else the default root)."""
    gate_table: str | Path | None = None
    """A table from build-gate-table to read the gates from (None: the real gates)."""
    device: str | torch.device | None = None
    """Where the model runs (None: the machine's accelerator, if any, else the CPU)."""
    engine: str = ENGINES[0]
    """A name of ENGINES: torch, or onnx (inference/onnx_engine.py)."""
    refine: bool = True
    """int8 with a folder's W8A8 scales: texts whose int8 classification is within the margin ``mtl-decoder
    quantize`` chose are predicted again in float32 (inference/refine.py); False: int8 alone."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> InferenceOptions:
        """The options a command's flags give (a flag the command lacks keeps its default)."""
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
        return cls(**given)

    def checked(self, flags: bool = False) -> InferenceOptions:
        """These options with each setting checked on its own.

        These options, each setting checked on its own (no model needed); a UserError naming the setting as a
        command's flag (``flags``) or as a keyword."""
        name = (lambda key: FLAGS.get(key, key)) if flags else (lambda key: key)
        size = self.batch_size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise UserError(f"{name('batch_size')} must be a positive integer, got {size!r}")
        if self.precision not in PRECISIONS:
            raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise UserError(f"{name('workers')} must be at least 1, got {self.workers}")
        check_max_tokens(self.max_tokens, name("max_tokens"))
        pack = self.pack_tokens
        if pack is not None and (not isinstance(pack, int) or isinstance(pack, bool) or pack < 0):
            raise UserError(f"{name('pack_tokens')} must be 0 (padded batches) or a positive row length, got {pack!r}")
        if self.engine not in ENGINES:
            raise UserError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.engine == "onnx" and self.precision != "fp32":
            raise UserError(
                f"--engine onnx runs the exported fp32 graph: leave --precision at fp32 (got {self.precision})"
            )
        if self.engine == "onnx" and self.gate_table is not None:
            raise UserError("--engine onnx runs the exported graph with its exact gates: leave out --gate-table")
        return self

    def on_device(self, device: str | torch.device | None) -> InferenceOptions:
        """These options on ``device`` when one is given (a launcher's process: its own), else as they are."""
        return self if device is None else dataclasses.replace(self, device=device)

    def target_device(self) -> torch.device:
        """The device the model will be loaded on."""
        return torch.device(self.device) if self.device is not None else default_device()


def check_max_tokens(max_tokens: int | None, name: str = "max_tokens") -> int | None:
    """Check a ``max_tokens`` setting.

    ``max_tokens`` if it is None (the model's default) or a whole number >= 0 (0: no token bound), else a
    UserError naming it as ``name`` (the keyword, or the flag ``--max-tokens`` at a command's entry point)."""
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0):
        raise UserError(f"{name} must be 0 (no token bound) or a positive number of sub-words, got {max_tokens!r}")
    return max_tokens


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of an inference precision on a device.

    The autocast dtype of an inference precision on ``device``; a UserError for an unknown one, and for fp16
    on a CPU, where torch runs it far slower than fp32 (about 25x): bf16 is the CPU's half precision."""
    if precision not in PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp16" and device.type == "cpu":
        raise UserError("precision fp16 is for GPUs: on a CPU use bf16 (or fp32)")
    if precision == "int8" and device.type != "cpu":
        raise UserError(
            f"precision int8 is for CPUs (torch's dynamic int8 kernels), not {device.type}: use bf16 or fp16"
        )
    return PRECISIONS[precision]
