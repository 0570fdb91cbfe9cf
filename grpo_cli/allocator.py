"""The C allocator's settings for a run: large blocks kept for reuse, not mapped afresh each time.

Every torch operation on a chunk allocates its result: tens of MiB for a million rows in float64.
glibc's malloc serves a block beyond its mmap threshold (128 KiB to start, raised as blocks are
freed, to 32 MiB at most) with a fresh ``mmap`` and returns it with ``munmap`` when it is freed,
so each such temporary faults in every page it touches, one 4 KiB page at a time: a run spent
more time faulting pages in than computing. :func:`reuse_freed_memory` asks malloc to serve
blocks of up to 1 GiB from its heap and to keep what is freed there for the next block.

What it costs: memory a run has freed stays with the process (it is reused, not returned to the
system, until 1 GiB lies free at the top of the heap), so the resident size after a peak stays
near that peak. ``grpo-cli`` calls it when a command runs; a program that uses the library may
call it too. It changes malloc for the whole process, so the library never calls it on its own.
Only glibc has these settings: elsewhere (macOS, musl) it does nothing and returns ``False``.

>>> isinstance(reuse_freed_memory(), bool)
True
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
LARGEST_HEAP_BLOCK = 1 << 30
"""Blocks up to this size come from the heap; freed memory is returned once this much lies free."""

MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(LARGEST_HEAP_BLOCK),
    "MALLOC_TRIM_THRESHOLD_": str(LARGEST_HEAP_BLOCK),
}
"""The same settings as glibc reads them from the environment when a process starts (the Ray
engine's private instance passes them to its worker processes)."""

_applied = False


def reuse_freed_memory() -> bool:
    """Keep large freed blocks for reuse (see the module's text); whether glibc took the settings."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # glibc returns 1 for a setting it takes; musl's mallopt takes none and returns 0
    _applied = bool(mallopt(M_MMAP_THRESHOLD, LARGEST_HEAP_BLOCK)) and bool(
        mallopt(M_TRIM_THRESHOLD, LARGEST_HEAP_BLOCK)
    )
    return _applied
