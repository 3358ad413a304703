"""Resumable checkpoints: Accelerate's ``save_state`` into a temporary folder, renamed into place only once
complete, so a kill mid-save never leaves a corrupt 'latest'; the newest K are kept."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from mtl_decoder.errors import UserError

STATE_FILE = "trainer_state.json"
PREFIX = "step-"


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a folder is complete when its name has no temporary prefix)."""
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
    tmp = root / f".tmp-{PREFIX}{step:07d}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):  # left by a run killed mid-save
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json_atomic(tmp / STATE_FILE, state)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in checkpoint_dirs(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, path: Path) -> dict[str, Any]:
    """Restore a checkpoint written by ``save_checkpoint``; returns the trainer state."""
    if not (path / STATE_FILE).is_file():
        raise UserError(f"{path}: not a complete checkpoint (no {STATE_FILE})")
    accelerator.load_state(str(path))
    return json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
