"""Advisory locks: an output file or a run folder is owned by one process at a time.

The lock is ``fcntl.flock`` on a small file beside the path (``.NAME.mtl-lock``, named like the temporaries, so
it fits NAME_MAX), holding the owner's process id for the message another process gets. The kernel drops a
flock when its process dies, however it dies, so a killed run never leaves a lock that blocks the next one.
The owner removes the file when it lets go; a process that locked a file someone removed meanwhile notices
(the path no longer names the file it locked) and tries again, so two processes never both believe they own it.

Advisory: it keeps mtl-decoder processes from each other; other programs are kept out by the no-replace commit of
``files.AtomicFile``. Where ``fcntl`` does not exist (Windows) locking is skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

from mtl_decoder.errors import UserError
from mtl_decoder.paths import sibling_prefix

LOCK_SUFFIX = ".mtl-lock"


def lock_path(path: str | Path) -> Path:
    """The lock file of ``path``: a hidden sibling."""
    path = Path(path)
    return path.with_name(sibling_prefix(path, room=len(LOCK_SUFFIX)) + LOCK_SUFFIX)


class PathLock:
    """A lock on a path, held by this process.

    Holds the lock of ``path`` from construction to ``release`` (or the end of a ``with`` block); a UserError
    naming the holder's PID when another process has it. ``doing`` says what the holder does, for the message
    ('being written', 'in use by a training run')."""

    def __init__(self, path: str | Path, doing: str = "in use", hint: str = "wait for it to finish"):
        self.path = Path(path)
        self.file = lock_path(self.path)
        self.fd: int | None = None
        try:
            import fcntl
        except ImportError:  # no advisory locks on this platform
            return
        while self.fd is None:
            try:
                fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise UserError(f"{self.path}: cannot create its lock file {self.file} ({err.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise UserError(
                    f"{self.path}: {doing} by another mtl-decoder process (PID {holder}); {hint}, or choose another "
                    "path"
                ) from None
            if _same_file(fd, self.file):
                self.fd = fd
            else:  # its previous owner removed it between our open and our lock: lock the new one
                os.close(fd)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self.fd is None:
            return
        self.file.unlink(missing_ok=True)  # while still locked: a waiting process then sees a new file
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> PathLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)
