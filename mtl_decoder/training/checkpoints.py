"""Resumable checkpoints, written atomically.

Resumable checkpoints: Accelerate's ``save_state`` into a temporary folder, renamed into place only once
complete, so a kill mid-save never leaves a corrupt 'latest'; the newest K are kept.

Every checkpoint lists its files with their sizes and SHA-256 in ``trainer_state.json``; a resume first checks
them, so a damaged checkpoint (an emptied RNG state, a truncated optimizer state) is an error naming the file,
never a silent partial restore.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from mtl_decoder.errors import UserError
from mtl_decoder.files import atomic_write_json, remove, replace_dir, stale_temporaries_in, temporary_sibling
from mtl_decoder.hashing import file_manifest, sha256_file
from mtl_decoder.termination import shielded

STATE_FILE = "trainer_state.json"
PREFIX = "step-"


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a folder is complete when it has its state file)."""
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / STATE_FILE).is_file()]
    return sorted(done, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(root: Path) -> Path | None:
    found = checkpoint_dirs(root)
    return found[-1] if found else None


def save_checkpoint(accelerator: Accelerator, root: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Save model, optimizer and RNG states (Accelerate) plus our JSON trainer state; all processes call it."""
    final = root / f"{PREFIX}{step:07d}"
    tmp = root / f".{final.name}.tmp"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in stale_temporaries_in(root):  # left by a run killed mid-save
            remove(stale)
        tmp = temporary_sibling(final)
    tmp = Path(accelerator_broadcast_path(accelerator, str(tmp)))
    accelerator.wait_for_everyone()
    try:
        with _expected_aliases_quiet(accelerator):
            accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            atomic_write_json(tmp / STATE_FILE, {**state, "files": file_manifest(tmp, skip=(STATE_FILE,))})
            replace_dir(tmp, final)
            for old in checkpoint_dirs(root)[:-keep]:
                remove(old)
    except BaseException as err:  # a full disk, SIGTERM: the half-written folder goes, the older ones stay
        if accelerator.is_main_process:
            with shielded():
                remove(tmp)
        if isinstance(err, Exception) and not isinstance(err, UserError):
            raise _write_failure(err, final, latest_checkpoint(root)) from None
        raise
    accelerator.wait_for_everyone()
    return final


_SHARED_WARNING = re.compile(r"Removed shared tensor (\{.*\}) while saving")


def tensor_aliases(state: dict[str, Any]) -> set[str]:
    """Names of a state dict whose tensor shares its storage with an earlier name (what a safetensors save drops)."""
    seen: set[Any] = set()
    aliases = set()
    for name, tensor in state.items():
        if not hasattr(tensor, "untyped_storage"):
            continue
        ptr = (tensor.untyped_storage().data_ptr(), tensor.device)
        if ptr in seen:
            aliases.add(name)
        seen.add(ptr)
    return aliases


class _ExpectedAliases(logging.Filter):
    """A log filter for Accelerate's expected shared-tensor warnings.

    Drops Accelerate's 'Removed shared tensor {...} while saving' when every name is an alias the model has by
    construction (a LoRA trunk's experts share one frozen MLP: hundreds of names); any other name keeps it."""

    def __init__(self, expected: set[str]):
        super().__init__()
        self.expected = expected

    def filter(self, record: logging.LogRecord) -> bool:
        found = _SHARED_WARNING.search(str(record.msg))  # Accelerate may prefix "[RANK 0] "
        if found is None:
            return True
        try:
            names = ast.literal_eval(found.group(1))
        except (ValueError, SyntaxError):
            return True
        return not {n.removeprefix("module.") for n in names} <= self.expected


@contextlib.contextmanager
def _expected_aliases_quiet(accelerator: Accelerator) -> Iterator[None]:
    expected: set[str] = set()
    for model in accelerator._models:
        expected |= {n.removeprefix("module.") for n in tensor_aliases(accelerator.unwrap_model(model).state_dict())}
    target = logging.getLogger("accelerate.utils.other")
    quiet = _ExpectedAliases(expected)
    target.addFilter(quiet)
    try:
        yield
    finally:
        target.removeFilter(quiet)


def _write_failure(err: Exception, final: Path, last: Path | None) -> UserError:
    """A one-line error for a failed checkpoint save.

    Saving states fails on a full disk with whatever the writer raises: an OSError, or from torch.save a
    RuntimeError ('file write failed', 'unexpected pos ...'); one line naming the checkpoint either way."""
    reason = (str(err).strip().splitlines() or [""])[0][:200]
    hint = "" if isinstance(err, OSError) else "; a full disk or a file size limit?"
    return UserError(
        f"{final}: cannot write the checkpoint ({type(err).__name__}: {reason}{hint}); its temporary folder was "
        f"removed; the last complete checkpoint is {last or 'none'}"
    )


def accelerator_broadcast_path(accelerator: Accelerator, path: str) -> str:
    """The main process's ``path`` on every process (the temporary name carries its pid)."""
    if accelerator.num_processes == 1:
        return path
    from accelerate.utils import broadcast_object_list

    holder = [path]
    broadcast_object_list(holder, from_process=0)
    return holder[0]


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """The trainer state of a complete, undamaged checkpoint; a UserError naming the first bad file otherwise."""
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise UserError(f"{path}: not a complete checkpoint (no {STATE_FILE})")
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{state_file}: unreadable ({err})") from None
    for name, expected in state.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise UserError(f"{file}: missing from the checkpoint; cannot resume from {path}")
        if file.stat().st_size != expected["bytes"] or sha256_file(file) != expected["sha256"]:
            raise UserError(f"{file}: damaged (size or checksum differs from when it was saved); cannot resume")
    return state


def load_checkpoint(accelerator: Accelerator, path: Path, verified: dict[str, Any] | None = None) -> dict[str, Any]:
    """Restore a checkpoint written by ``save_checkpoint``.

    Returns the trainer state. ``verified``: the state
    ``verify_checkpoint`` already returned for ``path`` (its files are then not hashed twice).

    Accelerate only logs a random-state file it cannot load and goes on with other random numbers than the
    unbroken run would have drawn, so this process's file must exist and not be empty (the manifest's checksums
    catch any other damage; a resume with more processes than saved the checkpoint finds no file for the new
    ones)."""
    state = dict(verified) if verified is not None else verify_checkpoint(path)
    rng = path / f"random_states_{accelerator.process_index}.pkl"
    if not rng.is_file() or rng.stat().st_size == 0:
        raise UserError(f"{rng}: missing or empty; cannot resume from {path} with the same random numbers")
    try:
        accelerator.load_state(str(path))
    except Exception as err:  # a state Accelerate or torch cannot read: the run cannot go on from it
        reason = (str(err).strip().splitlines() or [""])[0]
        raise UserError(f"{path}: cannot restore the checkpoint ({type(err).__name__}: {reason})") from None
    state.pop("files", None)
    return state
