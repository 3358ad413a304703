"""What a path is, in words a user can act on: before anything is read or written.

``path_problem`` says why a path cannot be read (not found, a folder, a symbolic link loop); ``check_name`` and
``check_writable_parent`` why an output cannot be created there (a NUL, a name over ``NAME_MAX`` bytes, a parent
that is a file or not writable), ``check_outside_model`` why it may not go there (into a model folder);
``output_kind`` what an existing output is. An output is a regular file or a new path: a symbolic link, a socket or
a block device is refused, never replaced; a character device or a FIFO (``/dev/null``, ``/dev/stdout``, a named
pipe) is written straight through, since replacing it would destroy it (as root, ``--output /dev/null --force``
replaced the system's) and a reader of a pipe cannot wait for a rename.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from mtl_decoder.errors import UserError

NAME_MAX = 255
"""Bytes in one file name on the file systems we write to (ext4, xfs, btrfs, tmpfs)."""


def os_reason(err: OSError) -> str:
    """An OSError as the few words a user needs ('No space left on device', 'symbolic link loop')."""
    if err.errno == errno.ELOOP:
        return "a symbolic link loop"
    if err.errno == errno.ENAMETOOLONG:
        return "a name too long for the file system"
    return err.strerror or str(err)


def path_problem(path: str | Path, want: str = "file") -> str | None:
    """Why a path cannot be read, or None.

    Why ``path`` cannot be read as a ``want`` ('file' or 'folder'), in words, or None when it can. A FIFO or a
    character device counts as a file (it can be read once, as a stream)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        dangling = os.path.islink(path)
        return f"{want} not found" + (" (a symbolic link to a missing path)" if dangling else "")
    except OSError as err:
        return f"is {os_reason(err)}" if err.errno in (errno.ELOOP, errno.ENAMETOOLONG) else f"cannot be read ({err})"
    except ValueError as err:  # a NUL byte in the name
        return f"cannot be a file name ({err})"
    if want == "folder":
        return None if stat.S_ISDIR(info.st_mode) else "is a file, not a folder"
    if stat.S_ISDIR(info.st_mode):
        return "is a folder, not a file"
    return None


def check_name(path: str | Path, what: str = "output") -> None:
    """A clear error for a name no file system takes: a NUL byte, or a part longer than NAME_MAX bytes."""
    text = str(path)
    if "\x00" in text:
        raise UserError(f"{what} {text!r}: a file name cannot hold a NUL character")
    for part in Path(path).parts:
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > NAME_MAX:
            raise UserError(
                f"{what} {path}: the name '{part[:40]}...' is {size} bytes, longer than a file system allows "
                f"({NAME_MAX}); choose a shorter {what}"
            )


def check_writable_parent(path: str | Path, what: str = "output") -> None:
    """Check that a path can be created in its folder.

    A clear error, before any work, when ``path`` cannot be created in its folder: an impossible name, a parent
    is a file or a link loop, or the nearest existing one is not writable. ``what`` names the option in the
    message (e.g. '--output')."""
    check_name(path, what)
    path = Path(path)
    for parent in [path.parent, *path.parent.parents]:
        try:
            exists = os.path.exists(parent) or os.path.islink(parent)
            if exists:
                os.stat(parent)
        except OSError as err:
            raise UserError(f"{what} {path}: {parent} is {os_reason(err)}; choose another {what}") from None
        if exists:
            if not parent.is_dir():
                raise UserError(f"{what} {path}: {parent} is a file, not a folder; choose another {what}")
            if not os.access(parent, os.W_OK):
                raise UserError(f"{what} {path}: folder {parent} is not writable; choose another {what}")
            return


NEW, FILE, STREAM = "new", "file", "stream"
"""What an output path is (``output_kind``): nothing yet, a regular file, or a device or FIFO written through."""
STDOUT = "/dev/stdout"
"""Standard output, as ``--output -`` names it: always written through, never a file to protect or replace, whatever
the shell redirected it to (a file, which /dev/stdout is then a link to, a pipe or a terminal)."""


def output_kind(path: str | Path, what: str = "--output") -> str:
    """The kind of an output path.

    NEW, FILE or STREAM for an output path; a UserError for anything an output must not replace: a folder, a
    symbolic link (replacing it would turn the link into a file and leave its target stale), a link loop, a
    socket or a block device."""
    path = Path(path)
    if str(path) == STDOUT:
        return STREAM
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        return NEW
    except OSError as err:
        raise UserError(f"{what} {path}: {os_reason(err)}; choose another {what}") from None
    try:
        info = os.stat(path)
    except OSError as err:
        reason = "a symbolic link to a missing path" if isinstance(err, FileNotFoundError) else os_reason(err)
        raise UserError(f"{what} {path}: is {reason}; choose another {what}") from None
    mode = info.st_mode
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return STREAM
    if stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a folder; choose another {what}")
    if stat.S_ISLNK(link.st_mode):
        target = os.path.realpath(path)
        raise UserError(
            f"{what} {path}: is a symbolic link (to {target}); writing would replace the link with a file: give "
            f"{target} itself, or another {what}"
        )
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} {path}: is not a regular file (a socket or a block device); choose another {what}")
    return FILE


def check_outside_model(
    target: str | Path,
    model_dir: str | Path | None,
    what: str = "--output",
    replaces: bool = False,
    own: str | Path | None = None,
) -> None:
    """Check that an output does not go into a model folder.

    An output never goes into a model folder (``model_dir``; None or not a folder: nothing to check): it could
    replace the model's own files (``--force``), and a model folder holds only what ``save_model`` wrote and the
    commands' own report folders: ``own``, the one the calling command writes by default (evaluate's MODEL/eval-SPLIT,
    diagnose's MODEL/diagnose), may be ``target`` exactly. ``replaces``: the output replaces the folder ``target``
    whole (export --force), so a ``target`` holding the model folder (its run folder, or one above) is refused too."""
    if model_dir is None or not Path(model_dir).is_dir():
        return
    model = Path(os.path.realpath(model_dir))
    resolved = Path(os.path.realpath(target))  # a link into the model folder is inside it; a link loop raises nothing
    if own is not None and resolved == Path(os.path.realpath(own)):
        return
    if model == resolved or model in resolved.parents:
        raise UserError(f"{what} {target}: is inside the model folder {model_dir}; write outputs somewhere else")
    if replaces and resolved in model.parents:
        raise UserError(
            f"{what} {target}: holds the model folder {model_dir}, which replacing it would delete; write outputs "
            "somewhere else"
        )


def sibling_prefix(path: str | Path, room: int) -> str:
    """The name start every helper file of a path shares.

    The name start every helper file of ``path`` shares (``.NAME``), shortened so that ``room`` more bytes fit
    in NAME_MAX: a long name keeps its first bytes and gets a hash of the whole name, so it stays unique."""
    name = Path(path).name
    if len(name.encode("utf-8", "surrogateescape")) + 1 + room <= NAME_MAX:
        return f".{name}"
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    head = name.encode("utf-8", "surrogateescape")[: NAME_MAX - room - len(digest) - 2]
    return f".{head.decode('utf-8', 'ignore')}~{digest}"
