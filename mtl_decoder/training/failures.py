"""How a training run ends when it cannot go on: one line for the user, and nothing half-made left behind.

``train`` hands every exception that ends a run to ``ending``: a run that fails before its first step leaves its
folder as it found it (``RunDirectory.abandon``), SIGTERM becomes a ``Terminated`` naming the checkpoint a
``--resume`` continues from, and an allocator failure (a model or batch too large for the machine) becomes a
``UserError`` naming the keys that size it. Anything else (a bug) keeps its traceback.
"""

from __future__ import annotations

import re
from pathlib import Path

from mtl_decoder.errors import UserError
from mtl_decoder.files import os_reason
from mtl_decoder.termination import Terminated
from mtl_decoder.training.checkpoints import latest_checkpoint
from mtl_decoder.training.run_dir import RunDirectory

OUT_OF_MEMORY = ("can't allocate memory", "not enough memory", "out of memory", "cannot allocate memory")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether an exception is an out-of-memory error.

    torch's CPU allocator raises RuntimeError('... DefaultCPUAllocator: can't allocate memory ...'); CUDA an
    OutOfMemoryError (a RuntimeError); Python a MemoryError."""
    if isinstance(err, MemoryError):
        return True
    return isinstance(err, RuntimeError) and any(m in str(err).lower() for m in OUT_OF_MEMORY)


def ending(err: BaseException, run: RunDirectory, started: bool, main_process: bool, step: int) -> BaseException:
    """The exception ``train`` raises for ``err``: ``err`` itself, or its one-line form (see the module doc).
    ``started``: whether setup finished (training steps began); before that the run folder is abandoned."""
    removed = run.abandon() if main_process and not started else []
    names = ", ".join(_short(p, run.path) for p in removed)
    gone = f"; removed {names} (nothing of this run is kept)" if removed else ""
    if isinstance(err, Terminated):
        last = latest_checkpoint(run.checkpoints)
        where = f"continue with --resume from {last}" if last else "no checkpoint yet, so a --resume has nothing"
        return Terminated(f"train stopped by SIGTERM at step {step}; temporary files removed; {where}{gone}")
    if is_out_of_memory(err):
        asked = re.search(r"tried to allocate [^.(]+", str(err))
        reason = asked.group(0).strip() if asked else (str(err).strip().splitlines() or [""])[0][:200]
        return UserError(
            f"out of memory ({reason}): the model or a batch is too large for this machine; lower model.d_model, "
            f"model.n_layers, model.expert_hidden or data.batch_size{gone}"
        )
    if isinstance(err, OSError):  # the environment: a full disk, a lost mount, a folder made read-only
        return UserError(f"{err.filename or run.path}: {os_reason(err)}{gone}")
    if isinstance(err, UserError) and gone:
        return UserError(f"{err}{gone}")
    return err


def _short(path: Path, run: Path) -> str:
    return str(path) if path == run else path.name
