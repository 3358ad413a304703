"""A run directory and what it holds; a run owns its folder.

    RUN/  .mtl-decoder-run  config.yaml  tokenizer.json  labels.json  data.json  metrics.jsonl  summary.json
          best/ (the model selected on validation)   checkpoints/step-NNNNNNN/ (resumable states)

``train`` writes into a folder only when it is empty, new, one of its own runs being resumed, or the user said
``--overwrite`` (which lists what it removes). Files found in a folder that is not a run are never read.
One process at a time owns a run folder (``lock``: an advisory lock beside it, ``.RUN.mtl-lock``), so a second
``train`` in it, with ``--overwrite`` or ``--resume``, stops at once naming the first one's PID. A run that fails
before training starts (bad data found late, a model too large for memory, a full disk) leaves the folder as it
found it (``abandon``). ``data.json`` holds a fingerprint of each training and validation file
(``training.resume``), so a resume refuses data changed since.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from mtl_decoder.errors import UserError
from mtl_decoder.files import atomic_write_json, atomic_write_text, check_writable_parent, remove
from mtl_decoder.locks import PathLock
from mtl_decoder.termination import shielded

MARKER = ".mtl-decoder-run"
CONFIG_FILE = "config.yaml"
TOKENIZER_FILE = "tokenizer.json"
LABELS_FILE = "labels.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
DATA_FILE = "data.json"
BEST_DIR = "best"
CHECKPOINTS_DIR = "checkpoints"


class RunDirectory:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.marker = self.path / MARKER
        self.config = self.path / CONFIG_FILE
        self.tokenizer = self.path / TOKENIZER_FILE
        self.labels = self.path / LABELS_FILE
        self.metrics = self.path / METRICS_FILE
        self.summary = self.path / SUMMARY_FILE
        self.data = self.path / DATA_FILE
        self.created: bool | None = None
        """Whether ``claim`` created the folder (None: not claimed by this process)."""
        self.best = self.path / BEST_DIR
        self.checkpoints = self.path / CHECKPOINTS_DIR

    def is_run(self) -> bool:
        """Whether the folder holds a run of ours (its marker; or, from before markers, a config and checkpoints)."""
        return self.marker.is_file() or (self.config.is_file() and self.checkpoints.is_dir())

    def contents(self) -> list[Path]:
        return sorted(self.path.iterdir()) if self.path.is_dir() else []

    def check_fresh(self, overwrite: bool) -> list[Path]:
        """Checks, before any work, that a new run may start here; returns what ``--overwrite`` will remove."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"--output-dir {self.path}: is a file, not a folder; choose another --output-dir")
        if self.path.is_dir():
            if not os.access(self.path, os.W_OK):
                raise UserError(f"--output-dir {self.path}: folder is not writable; choose another --output-dir")
        else:
            check_writable_parent(self.path, "--output-dir")
        found = self.contents()
        if not found or overwrite:
            return found
        if self.is_run():
            raise UserError(
                f"{self.path} already holds a run: use --resume to continue it, --overwrite to start it over, "
                "or another --output-dir"
            )
        names = ", ".join(p.name for p in found[:5]) + (", ..." if len(found) > 5 else "")
        raise UserError(
            f"{self.path} is not empty and is not a run of mtl-decoder ({names}): choose an empty or new "
            "--output-dir, or pass --overwrite to delete what it holds"
        )

    def claim(self, remove_first: list[Path]) -> None:
        """Make the run folder this run's.

        Make the folder this run's: remove what ``check_fresh`` listed (with --overwrite, saying so on stderr),
        write the marker."""
        if remove_first:
            names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in remove_first)
            print(f"--overwrite: removing from {self.path}: {names}", file=sys.stderr, flush=True)
        for path in remove_first:
            remove(path)
        self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.marker, {"created_by": "mtl-decoder"})

    def lock(self) -> PathLock:
        """This process's hold on the folder for the length of the run (a UserError naming the holder's PID)."""
        check_writable_parent(self.path, "--output-dir")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return PathLock(self.path, "in use by a training run", "wait for it to end (or stop it)")

    def abandon(self) -> list[Path]:
        """Undo ``claim`` for a run that failed before its first checkpoint.

        Remove the folder if this run created
        it, else what it wrote there. Returns what was removed (nothing when the run was not claimed here)."""
        if self.created is None or (self.checkpoints.is_dir() and any(self.checkpoints.iterdir())):
            return []
        removed = [self.path] if self.created else self.contents()
        with shielded():
            for path in removed:
                remove(path)
        self.created = None
        return removed

    def check_resumable(self) -> None:
        if not self.is_run():
            raise UserError(f"--resume: {self.path} holds no run of mtl-decoder to continue")

    def stored_config(self) -> dict[str, Any]:
        try:
            data = yaml.safe_load(self.config.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise UserError(f"{self.config}: cannot read the run's config ({err})") from None
        if not isinstance(data, dict):
            raise UserError(f"{self.config}: not a config")
        return data

    def stored_labels(self) -> dict[str, list[str]]:
        try:
            return json.loads(self.labels.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise UserError(f"{self.labels}: cannot read the run's label sets ({err})") from None

    def write_config(self, text: str) -> None:
        atomic_write_text(self.config, text)

    def write_labels(self, label_sets: dict[str, list[str]]) -> None:
        atomic_write_json(self.labels, label_sets)

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.summary, summary)

    def write_fingerprints(self, prints: dict[str, dict[str, Any]]) -> None:
        atomic_write_json(self.data, prints)

    def stored_fingerprints(self) -> dict[str, dict[str, Any]] | None:
        """The data fingerprints written when the run started; None for a run from before they were kept."""
        if not self.data.is_file():
            return None
        try:
            return json.loads(self.data.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise UserError(f"{self.data}: cannot read the run's data fingerprints ({err})") from None
