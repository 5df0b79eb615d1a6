"""The process heap: give freed memory back to the operating system (glibc only; a no-op elsewhere).

The commands that read evidence (gate, report, verify, combine, compare, and `run` once its
load is over) build large numpy arrays and free many chunk-sized temporaries. glibc's malloc
serves a request of at least M_MMAP_THRESHOLD bytes with its own mmap, unmapped when freed --
but its default threshold *slides*: freeing an mmapped block raises the threshold to that
block's size (up to 32 MiB), so every later temporary below it comes from the heap, whose free
space in the middle is never given back. At 10^6 requests that kept ~35-50 MiB of freed memory
resident through the judge (measured: `gate`'s RSS after the join 165 MiB with the sliding
threshold, 129 MiB with a fixed one; benchmarks/README.md, "Soak scale"). A fixed threshold
(`limit_retention`, set once when a command starts) keeps large temporaries out of the heap;
`release` (malloc_trim) returns what the heap holds free at a phase boundary, e.g. when a
run's load ends and its evidence is collected and judged.

Both are mallopt/malloc_trim through ctypes: on a libc without them (musl, macOS) they do
nothing and say so by returning False. `_libc` is the seam tests replace.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD = 128 * 1024  # glibc's default starting value, held fixed


@functools.cache
def _libc() -> Any | None:
    """glibc, when this process runs on it (None otherwise): the symbols the process has
    loaded already (dlopen(NULL)), never `ctypes.util.find_library`, which runs `ldconfig -p`
    (or a compiler) -- a process every command would start, `check` and `plan` included."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    return libc


def limit_retention() -> bool:
    """Fix malloc's mmap threshold at MMAP_THRESHOLD (no sliding): a block of 128 KiB or more
    is mapped on its own and returned when freed. True when set."""
    libc = _libc()
    return libc is not None and libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD)) == 1


def release() -> bool:
    """Return the heap's free memory to the operating system now (malloc_trim(0)). True when
    the call was made (whether or not it found anything to return)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(ctypes.c_size_t(0))
    return True
