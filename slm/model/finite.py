"""Whether float32 bytes are all finite, without NumPy when the C kernels are built.

An activation checks that every adapter tensor is finite; with NumPy that check would cost the
NumPy import (most of a `slm activate`'s start-up), so the C kernels' f32_all_finite does it
over the bytes as they were read (called as a function of the extension module: no ctypes
either). NumPy is the fallback where the kernels are not built."""

from __future__ import annotations

import functools


@functools.cache
def _check():
    from slm.model import cpu_variants

    kernels = cpu_variants.module()  # (None: not built at install; the NumPy fallback below)
    return None if kernels is None else kernels.f32_all_finite


def f32_all_finite(data: bytes) -> bool:
    """Whether the little-endian float32 values in `data` (a multiple of 4 bytes) are all finite."""
    if len(data) % 4:
        raise ValueError(f"{len(data)} bytes are not whole float32 values")
    check = _check()
    if check is None:
        import numpy as np

        return bool(np.isfinite(np.frombuffer(data, dtype="<f4")).all())
    return check(data)
