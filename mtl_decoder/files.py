"""Files that appear whole or not at all, with one naming scheme for everything written on the way.

Every output (a model folder, metrics, a checkpoint's state, prediction files) is first written under a
temporary sibling name ``.NAME.mtl-tmp-PID-RANDOM`` in the same folder (same file system, so the final rename
is atomic) and renamed into place only once complete. The process id in the name lets a later run tell the
leftovers of a killed process (``stale_temporaries``) from those of one still running.

A name too long for a temporary suffix (the file system allows ``NAME_MAX`` bytes per name) is shortened in the
temporary name only: its start plus a hash of the whole name, so it stays unique and recognisable.

An output is a regular file or a new path (``paths.output_kind``): a link, a socket or a block device is refused,
a character device or a FIFO written straight through. While an
``AtomicFile`` is open it holds the output's advisory lock (``mtl_decoder.locks``), so two processes never write
one output at the same time; without ``replace`` it never replaces a file that appeared while it was written.

A write that fails (a full disk, a file size limit) removes the temporary file and raises a one-line
``UserError`` naming the output.

Clean-ups here run ``shielded`` (``mtl_decoder.termination``), so a SIGTERM cannot cut them short half-way.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mtl_decoder import paths
from mtl_decoder.errors import UserError
from mtl_decoder.paths import (  # noqa: F401 - check_writable_parent, FILE, NEW, path_problem: the files API
    FILE,
    NAME_MAX,
    NEW,
    STDOUT,
    STREAM,
    check_name,
    check_writable_parent,
    os_reason,
    output_kind,
    path_problem,
)
from mtl_decoder.termination import shielded

TMP_MARK = ".mtl-tmp-"
TEMP_SUFFIX_BYTES = len(TMP_MARK) + 20 + 1 + 8
"""The most a temporary suffix adds: the mark, a pid (at most 20 digits), '-', 8 hex digits."""


def sibling_prefix(path: str | Path, room: int = TEMP_SUFFIX_BYTES) -> str:
    """``paths.sibling_prefix`` with room for this module's temporary suffix by default."""
    return paths.sibling_prefix(path, room)


def temporary_sibling(path: str | Path) -> Path:
    """A fresh temporary name beside ``path``, owned by this process (within NAME_MAX, however long the name)."""
    path = Path(path)
    return path.with_name(f"{sibling_prefix(path)}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


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
    return stale_temporaries_in(path.parent, f"{sibling_prefix(path)}{TMP_MARK}")


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


class WriteFailed(UserError):
    """An output that could not be written; ``reason`` says why in a few words ('No space left on device')."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def write_failed(path: Path, err: OSError | str, stream: bool = False) -> WriteFailed:
    """The one-line error for an output that could not be written (a full disk, a size limit, a lost mount)."""
    reason = os_reason(err) if isinstance(err, OSError) else err
    if stream:
        return WriteFailed(f"{path}: cannot write ({reason}); stopped (a device or pipe keeps what reached it)", reason)
    return WriteFailed(f"{path}: cannot write ({reason}); the temporary file was removed, {path} is as it was", reason)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary sibling and a rename; a failed write leaves nothing."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        raise write_failed(path, err) from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def umask() -> int:
    """The process's file-creation mask (read from /proc where it can be, so no other thread sees it change)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_reason(err: BaseException) -> str:
    """The few words of a failed write ('No space left on device'), from an OSError or safetensors' wrapped one."""
    if isinstance(err, OSError):
        return os_reason(err)
    found = re.search(r'message: "([^"]+)"', str(err))
    return found.group(1) if found else (str(err).strip().splitlines() or ["write failed"])[0]


def atomic_write_safetensors(path: str | Path, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
    """Write a safetensors file atomically.

    Write ``tensors`` as a safetensors file through a temporary sibling and a rename, with the permissions of
    any other new file (safetensors itself creates 0600); a failed write (a full disk) leaves nothing and is a
    one-line ``UserError`` naming ``path``."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except OSError as err:
        raise write_failed(path, err) from None
    except SafetensorError as err:  # how safetensors reports a full disk
        raise write_failed(path, write_reason(err)) from None
    finally:
        with shielded():
            tmp.unlink(missing_ok=True)
    return path


def replace_dir(tmp: Path, final: Path) -> None:
    """Replace a folder by a fully written one.

    Move a fully written folder ``tmp`` to ``final``: an old one is renamed aside, the new one renamed in, and
    only then the old one removed, so ``final`` never holds garbage and is missing only between two renames."""
    old = temporary_sibling(final)
    if not os.path.lexists(final):
        os.replace(tmp, final)
        return
    os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        with shielded():
            os.replace(old, final)  # the old one back where it was
        raise
    with shielded():
        remove(old)


@contextmanager
def staged_folder(final: Path) -> Iterator[Path]:
    """A temporary folder whose entries move into ``final`` on success.

    A temporary folder beside ``final`` to write a set of outputs into; on success its entries move into
    ``final`` (created whole by one rename when new; an existing folder keeps its other files), on any error or
    SIGTERM it is removed, so no empty or half-filled output folder is left. The temporaries a killed run (SIGKILL)
    left beside ``final`` and inside it are removed first."""
    final = Path(final)
    for stale in stale_temporaries(final) + stale_temporaries_in(final):
        remove(stale)
    tmp = temporary_sibling(final)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if not final.exists():
            os.replace(tmp, final)
            return
        for entry in sorted(tmp.iterdir()):
            if entry.is_dir():
                replace_dir(entry, final / entry.name)
            else:
                os.replace(entry, final / entry.name)
    finally:
        with shielded():
            remove(tmp)


class AtomicFile:
    """A text file written to a temporary sibling of ``path``.

    ``commit`` renames it into place, ``discard``
    removes it. Used as a context manager, leaving the block without ``commit`` (an error) discards it.

    While open it holds ``path``'s lock (another process writing it is an error naming its PID). ``replace``:
    whether an existing file may be replaced; without it a file that appears at ``path`` meanwhile (another
    program's) is never overwritten. A device or FIFO (``output_kind`` STREAM) is written straight through."""

    def __init__(self, path: str | Path, replace: bool = True):
        from mtl_decoder.locks import PathLock

        self.path = Path(path)
        self.replace = replace
        self.lines = 0
        self.tmp: Path | None = None
        self.lock: PathLock | None = None
        if str(self.path) == STDOUT:  # the process's own standard output, not truncated, wherever it leads
            sys.stdout.flush()
            self.file = open(os.dup(sys.stdout.fileno()), "w", encoding="utf-8", newline="\n")  # noqa: SIM115
            return
        if output_kind(self.path) == STREAM:
            self.file = open(self.path, "w", encoding="utf-8", newline="\n")  # noqa: SIM115 - closed by commit/discard
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = PathLock(self.path, "being written")
        try:
            if not replace and os.path.lexists(self.path):
                raise UserError(f"{self.path}: appeared after this run started (another program's?); not replaced")
            self.tmp = temporary_sibling(self.path)
            self.file = open(self.tmp, "x", encoding="utf-8", newline="\n")  # noqa: SIM115 - closed by commit/discard
        except BaseException:  # refused, or a SIGTERM just after the temporary was created: it goes
            if self.tmp is not None:
                self.tmp.unlink(missing_ok=True)
            self.lock.release()
            raise

    def write_line(self, text: str) -> None:
        try:
            self.file.write(text + "\n")
        except OSError as err:
            self.discard()
            raise write_failed(self.path, err, stream=self.tmp is None) from None
        self.lines += 1

    def write_json(self, record: dict[str, Any]) -> None:
        self.write_line(json.dumps(record, ensure_ascii=False))

    def commit(self) -> Path:
        try:
            self.file.close()
            if self.tmp is not None:
                self._move_into_place()
        except OSError as err:
            self.discard()
            raise write_failed(self.path, err, stream=self.tmp is None) from None
        except BaseException:  # refused (a file appeared) or SIGTERM: the temporary goes
            self.discard()
            raise
        finally:
            self._unlock()
        return self.path

    def _move_into_place(self) -> None:
        if self.replace:
            os.replace(self.tmp, self.path)
            return
        try:  # a hard link never replaces: it fails when something appeared at the path meanwhile
            os.link(self.tmp, self.path)
        except FileExistsError:
            raise UserError(
                f"{self.path}: appeared while this run wrote it (another program's?); not replaced, this run's "
                "output was discarded"
            ) from None
        except OSError:  # a file system without hard links
            if os.path.lexists(self.path):
                raise UserError(f"{self.path}: appeared while this run wrote it; not replaced") from None
            os.replace(self.tmp, self.path)
        self.tmp.unlink(missing_ok=True)

    def discard(self) -> None:
        """Remove the temporary file, whatever closing it says (a full disk fails the final flush again)."""
        with shielded():
            try:
                self.file.close()
            except OSError:
                pass
            finally:
                if self.tmp is not None:
                    self.tmp.unlink(missing_ok=True)
                self._unlock()

    def _unlock(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.file.closed or self.lock is not None:  # not committed: an error, or never got to commit
            self.discard()
