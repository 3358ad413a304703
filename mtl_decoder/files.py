"""Files that appear whole or not at all, with one naming scheme for everything written on the way.

Every output (a model folder, metrics, a checkpoint's state, prediction files) is first written under a
temporary sibling name ``.NAME.mtl-tmp-PID-RANDOM`` in the same folder (same file system, so the final rename
is atomic) and renamed into place only once complete. The process id in the name lets a later run tell the
leftovers of a killed process (``stale_temporaries``) from those of one still running.

``terminate_unwinds`` turns SIGTERM into a ``Terminated`` exception for the duration of a block, so that the
``with`` blocks inside it (``AtomicFile``) discard their temporaries instead of leaving them to a later run.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mtl_decoder.errors import UserError

TMP_MARK = ".mtl-tmp-"


class Terminated(BaseException):
    """SIGTERM received inside ``terminate_unwinds``. A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way swallows it; the CLI exits with status 143 (128 + SIGTERM)."""

    exit_code = 128 + signal.SIGTERM


class Unwinder:
    """What ``terminate_unwinds`` yields: ``deferred()`` holds a SIGTERM back for the length of a short block
    (renaming finished files into place), so that a set of files is committed together or not at all."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending = False

    @contextmanager
    def deferred(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if self.pending and not self.depth:
            self.pending = False
            raise Terminated("terminated by SIGTERM")


@contextmanager
def terminate_unwinds() -> Iterator[Unwinder]:
    """Within the block, SIGTERM raises ``Terminated`` in the main thread, so ``with`` and ``finally`` blocks run
    (temporaries are discarded) before the process exits. The first SIGTERM puts the previous handler back, so a
    second one acts as it did before (by default: kills at once); the previous handler is restored on leaving
    the block either way. Outside the main thread (where Python cannot set handlers) nothing changes."""
    unwinder = Unwinder()
    if threading.current_thread() is not threading.main_thread():
        yield unwinder
        return
    previous = signal.getsignal(signal.SIGTERM)
    restore = signal.SIG_DFL if previous is None else previous  # None: a handler not set from Python

    def handler(signum, frame):
        if unwinder.depth:
            unwinder.pending = True
            return
        signal.signal(signal.SIGTERM, restore)
        raise Terminated("terminated by SIGTERM")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield unwinder
    finally:
        signal.signal(signal.SIGTERM, restore)


def temporary_sibling(path: str | Path) -> Path:
    """A fresh temporary name beside ``path``, owned by this process."""
    path = Path(path)
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def stale_temporaries(path: str | Path) -> list[Path]:
    """Temporary siblings of ``path`` left by processes that no longer run (a run killed mid-write)."""
    path = Path(path)
    return stale_temporaries_in(path.parent, f".{path.name}{TMP_MARK}")


def stale_temporaries_in(folder: str | Path, prefix: str = ".") -> list[Path]:
    """Temporaries in ``folder`` whose names start with ``prefix``, left by processes that no longer run."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = []
    for candidate in folder.iterdir():
        name = candidate.name
        if not name.startswith(prefix) or TMP_MARK not in name:
            continue
        pid = name.rsplit(TMP_MARK, 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            stale.append(candidate)
    return sorted(stale)


def remove(path: Path) -> None:
    """Remove a file or a folder tree, whichever ``path`` is; nothing if it is gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def check_writable_parent(path: str | Path, what: str = "output") -> None:
    """A clear error, before any work, when ``path`` cannot be created in its folder: a parent is a file, or the
    nearest existing one is not writable. ``what`` names the option in the message (e.g. '--output')."""
    path = Path(path)
    for parent in [path.parent, *path.parent.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{what} {path}: {parent} is a file, not a folder; choose another {what}")
            if not os.access(parent, os.W_OK):
                raise UserError(f"{what} {path}: folder {parent} is not writable; choose another {what}")
            return


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary sibling and a rename."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a fully written folder ``tmp`` to ``final``, replacing an old one without a moment of garbage."""
    old = temporary_sibling(final)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    remove(old)


class AtomicFile:
    """A text file written to a temporary sibling of ``path``; ``commit`` renames it into place, ``discard``
    removes it. Used as a context manager, leaving the block without ``commit`` (an error) discards it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = temporary_sibling(self.path)
        self.file = open(self.tmp, "x", encoding="utf-8", newline="\n")  # noqa: SIM115 - closed by commit/discard
        self.lines = 0

    def write_line(self, text: str) -> None:
        self.file.write(text + "\n")
        self.lines += 1

    def write_json(self, record: dict[str, Any]) -> None:
        self.write_line(json.dumps(record, ensure_ascii=False))

    def commit(self) -> Path:
        self.file.close()
        os.replace(self.tmp, self.path)
        return self.path

    def discard(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.file.closed:  # not committed: an error, or the caller never got to commit
            self.discard()
