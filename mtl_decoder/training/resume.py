"""What a resumed run may change.

The stored config against the new one, and the data files against their
fingerprints, before anything is written.

A resume continues the same run, so whatever fixes the model's shapes, the data order or the meaning of the
selection score must be the same. Keys that only steer how long or how verbosely the run goes on are honoured.
The same holds for the data: a training or validation file rewritten in place (relabelled, grown) would go on
under the old file's step count, epoch position and best score, so a changed one is refused. A file's
fingerprint is its size and SHA-256 (of the whole file up to ``FULL_HASH_BYTES``; beyond, of ``SAMPLES``
blocks spread over it, plus its modification time, since a sample can miss an edit).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import typing
from pathlib import Path
from typing import Any

from mtl_decoder.config import ExperimentConfig
from mtl_decoder.errors import UserError
from mtl_decoder.hashing import sampled_sha256, sha256_file

FINGERPRINTED_SPLITS = ("train", "validation")
"""The splits a run's steps and scores depend on (the test split is honoured: a resume never reads it)."""
FULL_HASH_BYTES = 256 << 20
"""Files up to this size are hashed whole (about a second); larger ones by samples."""
SAMPLES, SAMPLE_BYTES = 64, 64 << 10

HONOURED = (
    "training.max_steps",
    "training.epochs",
    "training.max_minutes",
    "training.eval_every",
    "training.patience",
    "training.log_every",
    "training.keep_checkpoints",
    "training.progress",
    "training.lr",
    "training.output_dir",
    "training.resume_from",
    "model.dropout",
    "data.eval_batch_size",
    "evaluation.*",
    "tasks.*.data.test",
)
"""Keys a resume may change, and that take effect from the resumed step on (lr: the schedule's peak)."""


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config dict as dotted keys; the task list becomes tasks.NAME.field."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            if prefix == "" and key == "tasks" and isinstance(value, list):
                for task in value:
                    out.update(flatten(task, f"tasks.{task.get('name')}."))
            else:
                out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


_MISSING = object()


def _section(name: str) -> tuple[Any, bool]:
    """A top-level section's default value and whether the section is optional (None unless given, as distill)."""
    spec = {f.name: f for f in dataclasses.fields(ExperimentConfig)}.get(name)
    if spec is None:
        return _MISSING, False
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory(), False
    kinds = typing.get_args(typing.get_type_hints(ExperimentConfig).get(name))
    section = next((k for k in kinds if dataclasses.is_dataclass(k)), None)
    if spec.default is not None or section is None:
        return _MISSING, False
    return section(), True


def key_default(key: str) -> Any:
    """The default of a dotted config key.

    The value a dotted key (``model.trunk.layers``, ``distill.state_weight``) takes in a config that leaves it out
    (an optional section's keys: within the section); _MISSING for keys with no default of their own (tasks.*,
    distill.teacher)."""
    first, *rest = key.split(".")
    node, _ = _section(first)
    for part in rest:
        if not (dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}):
            return _MISSING
        node = getattr(node, part)
    return node


def changed_keys(stored: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Keys whose value differs.

    A key the stored config lacks counts as its default: the run was started by a version before the key existed,
    and a new key's default is always the behaviour from before it. Not so for a whole optional section the stored
    config lacks (a plain run resumed as a distilled one changes what it is)."""
    old, now = flatten(stored), flatten(new)
    keys = sorted(set(old) | set(now))

    def added_at_default(k: str) -> bool:
        section = k.split(".")[0]
        if _section(section)[1] and not isinstance(stored.get(section), dict):
            return False
        return now[k] is None or now[k] == key_default(k)

    return {
        k: (old.get(k), now.get(k))
        for k in keys
        if old.get(k, _MISSING) != now.get(k, _MISSING) and not (k not in old and added_at_default(k))
    }


def honoured(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in HONOURED)


def check_resume_changes(stored: dict[str, Any], new: dict[str, Any], config_path: str) -> dict[str, tuple]:
    """The honoured changes; a UserError listing the others (nothing has been written yet when it is raised)."""
    changes = changed_keys(stored, new)
    refused = {k: v for k, v in changes.items() if not honoured(k)}
    if refused:
        shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(refused.items())[:4])
        more = f" (and {len(refused) - 4} more)" if len(refused) > 4 else ""
        raise UserError(
            f"--resume: the config differs from the run's {config_path} in keys a resume cannot change: "
            f"{shown}{more}. Start a new run (another --output-dir) to change them"
        )
    return {k: v for k, v in changes.items() if k not in ("training.output_dir", "training.resume_from")}


def data_fingerprints(cfg: ExperimentConfig) -> dict[str, dict[str, Any]]:
    """Each local training and validation file of the config -> its fingerprint (hub datasets have none)."""
    prints: dict[str, dict[str, Any]] = {}
    for task in cfg.tasks.values():
        if task.data.hub_id:
            continue
        for split in FINGERPRINTED_SPLITS:
            where = getattr(task.data, split)
            if where and where not in prints and Path(where).is_file():
                prints[where] = fingerprint(Path(where))
    return prints


def fingerprint(path: Path) -> dict[str, Any]:
    info = path.stat()
    if info.st_size <= FULL_HASH_BYTES:
        return {"bytes": info.st_size, "sha256": sha256_file(path)}
    sampled = sampled_sha256(path, SAMPLES, SAMPLE_BYTES)
    return {"bytes": info.st_size, "sha256_sampled": sampled, "mtime_ns": info.st_mtime_ns}


def check_data_unchanged(stored: dict[str, dict[str, Any]] | None, now: dict[str, dict[str, Any]], where: str) -> None:
    """Check the data files against their fingerprints.

    A UserError listing the data files that differ from their fingerprints in ``where`` (the run's data.json);
    nothing for a run from before fingerprints were kept (``stored`` None)."""
    if stored is None:
        return
    changed = []
    for path, before in stored.items():
        after = now.get(path) or (fingerprint(Path(path)) if os.path.isfile(path) else None)
        if after is None:
            changed.append(f"{path} (gone)")
        elif after != before:
            size = f", {before['bytes']:,} -> {after['bytes']:,} bytes" if after["bytes"] != before["bytes"] else ""
            changed.append(f"{path} (content differs{size})")
    if changed:
        raise UserError(
            f"--resume: data changed since the run started (fingerprints in {where}): {'; '.join(changed)}. "
            "Restore the files, or start a new run (another --output-dir) on the new data"
        )
