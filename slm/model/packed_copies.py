"""The int8 mode's packed copies of weights (qkernels/rows_q4x8.c, rows_q5x8.c, rows_q6kx8.c), and giving
back the pages of the weights they replace.

A Q4_0, Q4_1, Q5_0, Q4_K or Q6_K weight whose rows come in eights is read, in the int8 mode, from a
copy packed for the kernels (docs/kernels.md, "Derived layouts"): built in memory the first
time an int8 product needs it, kept while the weight lives, never written to the store. The
weight's own file-mapped bytes, read once to build the copy, would otherwise stay resident
beside it and double the process's memory for those weights: each slice's pages are released
once packed. Only pages of a file mapping are released (they come back from the file if
anything reads them again: the embedding lookup, the float32 mode); memory of any other kind
is left alone.
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np

from slm.model import kernels_native as kn
from slm.model.weights import QuantTensor

PACK_SLICE_BYTES = 16 << 20  # rows packed, then released, at a time
_PACKED: dict[int, np.ndarray] = {}  # id(weight) -> its packed rows, while the weight lives
_PACKING = threading.Lock()


def packed(w: QuantTensor) -> np.ndarray | None:
    """w's rows packed for the int8 kernels (slm_pack), or None for a weight without a layout
    (another type, rows not a multiple of 8: the C side says, slm_packed_bytes). As many bytes
    as the weight's own (Q4_K: 2% more). The fused step and the op path read the same copy, so
    that they give the same bits."""
    type_id = kn.kernel_type(w)
    if type_id is None:
        return None
    got = _PACKED.get(id(w))
    if got is None:
        with _PACKING:  # (once per weight, whichever threads ask at the same time)
            return _pack(w, type_id)
    return got


def _pack(w: QuantTensor, type_id: int) -> np.ndarray | None:
    got = _PACKED.get(id(w))
    if got is None:
        size = kn.LIB.slm_packed_bytes(type_id, w.rows, w.data.strides[0], w.cols)
        if size < 0:
            return None
        got = np.empty(size, dtype=np.uint8)
        # in slices, each one's own pages released once packed: never the weight and its copy together
        step = max(8, PACK_SLICE_BYTES // w.data.strides[0] // 8 * 8)
        for r0 in range(0, w.rows, step):
            r1 = min(w.rows, r0 + step)
            kn.check_status(kn.LIB.slm_pack(type_id, w.data[r0].ctypes.data, r1 - r0, w.data.strides[0], w.cols,
                                            got.ctypes.data + size // w.rows * r0), "slm_pack", w.name)
            release(w.data[r0:r1])
        _PACKED[id(w)] = got
        weakref.finalize(w, _PACKED.pop, id(w), None)
    return got


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
