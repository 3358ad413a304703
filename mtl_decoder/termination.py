"""SIGTERM as an exception, so that a launcher's stop unwinds a run instead of cutting it off.

``terminate_unwinds`` turns SIGTERM into a ``Terminated`` exception for the duration of a block, so that the
``with`` blocks inside it (``mtl_decoder.files.AtomicFile``) discard their temporaries instead of leaving them to a
later run; ``shielded`` holds a SIGTERM back while such a clean-up runs, so the signal cannot cut it short half-way.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(BaseException):
    """SIGTERM received inside ``terminate_unwinds``.

    A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way swallows it; the CLI exits with status 143 (128 + SIGTERM)."""

    exit_code = 128 + signal.SIGTERM


class Unwinder:
    """What ``terminate_unwinds`` yields.

    ``deferred()`` holds a SIGTERM back for the length of a short block
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


_UNWINDERS: list[Unwinder] = []
"""The live ``terminate_unwinds`` blocks of the main thread, innermost last (what ``shielded`` defers to)."""


@contextmanager
def shielded() -> Iterator[None]:
    """Hold SIGTERM back for a clean-up block.

    Hold SIGTERM back for a clean-up block (removing temporaries): a launcher's SIGTERM that lands while an
    error is already being unwound would otherwise raise inside the clean-up and leave the rest of it undone. The
    signal takes effect when the outermost shielded block ends; outside ``terminate_unwinds`` nothing changes."""
    if not _UNWINDERS or threading.current_thread() is not threading.main_thread():
        yield
        return
    with _UNWINDERS[-1].deferred():
        yield


@contextmanager
def terminate_unwinds() -> Iterator[Unwinder]:
    """Turn SIGTERM into an exception within the block.

    Within the block, SIGTERM raises ``Terminated`` in the main thread, so ``with`` and ``finally`` blocks run
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
    _UNWINDERS.append(unwinder)
    try:
        yield unwinder
    finally:
        _UNWINDERS.remove(unwinder)
        signal.signal(signal.SIGTERM, restore)
