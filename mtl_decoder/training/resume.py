"""What a resumed run may change: the stored config against the new one, before anything is written.

A resume continues the same run, so whatever fixes the model's shapes, the data order or the meaning of the
selection score must be the same. Keys that only steer how long or how verbosely the run goes on are honoured.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from mtl_decoder.errors import UserError

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


def changed_keys(stored: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    old, now = flatten(stored), flatten(new)
    keys = sorted(set(old) | set(now))
    missing = object()
    return {
        k: (old.get(k), now.get(k))
        for k in keys
        if old.get(k, missing) != now.get(k, missing) and not (k not in old and now[k] is None)
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
