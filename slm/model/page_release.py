"""Giving back the resident pages of a memory-mapped weight that is no longer read.

In the int8 mode a packed copy of a weight replaces it in every product (kernels_native.packed):
its file-mapped bytes, read once to build the copy, would otherwise stay resident beside it and
double the process's memory for those weights. Only pages of a file mapping are released (they
come back from the file if anything reads them again: the embedding lookup, the float32 mode);
memory of any other kind is left alone.
"""

from __future__ import annotations

import mmap

import numpy as np


def mapping_of(a: np.ndarray) -> mmap.mmap | None:
    """The mmap.mmap of a file that a's memory is a view of (through any arrays), or None."""
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def release(a: np.ndarray) -> None:
    """Drops the whole pages inside a's bytes from this process's resident memory, when a is a
    view of a file mapping (Linux's MADV_DONTNEED: a file's pages are read again on the next
    access). A hint: where it cannot be given, nothing changes."""
    mapped = mapping_of(a)
    if mapped is None or not hasattr(mmap, "MADV_DONTNEED") or a.nbytes == 0:
        return
    offset = a.ctypes.data - np.frombuffer(mapped, dtype=np.uint8, count=1).ctypes.data
    first = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
    last = (offset + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        try:
            mapped.madvise(mmap.MADV_DONTNEED, first, last - first)
        except (OSError, ValueError):
            pass
