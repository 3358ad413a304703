"""Process memory tuning for training on glibc (Linux) CPUs.

Gradients of large tables (the token embedding, the hashed word features) are fresh tensors every step.
glibc serves allocations this large with mmap and unmaps them on free, so each step page-faults them in
again: zero-filling a fresh 33 MB tensor took 23 ms here, 8 ms once freed memory is kept for reuse.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Keep freed memory in the process instead of returning it to the OS.

    Ask glibc to serve large allocations from the heap and not return freed memory to the OS (the process
    keeps its peak size). Returns whether it applied; a no-op off glibc."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1))
