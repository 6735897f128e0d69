"""Fused dequantize-and-multiply kernels (numba), for decode and short batches.

`matmul(x, w)` reads each quantized block once, decodes it in registers and multiplies it
with every input row, so no float32 copy of a weight is ever made. Rows are split over all
cores (numba prange). Long batches (a prompt's prefill) go to the reference path, where
BLAS on a dequantized chunk wins. The reference path (slm.model.kernels) stays the ground
truth; tests/test_kernels.py differential-tests the two on every type (1e-5 relative).

Block layouts: see slm/quant (q8_0.py, q4_0.py, q4_1.py, nf4.py). float16 scales are decoded
through a 65536-entry table.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from slm.model.kernels import ReferenceKernels
from slm.model.weights import QuantTensor
from slm.quant.nf4 import CODEBOOK

F16_TABLE = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)  # bits -> value
NF4_TABLE = CODEBOOK.astype(np.float32)
FUSED_MAX_TOKENS = 8  # above this, dequantize + BLAS is faster


@njit(parallel=True, fastmath=True, cache=True)
def _q8_0(x, data, f16, out):  # x (T, n) f32; data (rows, nb*34) u8; out (T, rows) f32
    T, n = x.shape
    rows = data.shape[0]
    nb = n // 32
    for r in prange(rows):
        acc = np.zeros(T, dtype=np.float32)
        for b in range(nb):
            o = b * 34
            d = f16[np.int64(data[r, o]) | (np.int64(data[r, o + 1]) << 8)]
            for t in range(T):
                s = np.float32(0.0)
                for j in range(32):
                    q = np.int64(data[r, o + 2 + j])
                    if q > 127:
                        q -= 256
                    s += np.float32(q) * x[t, b * 32 + j]
                acc[t] += d * s
        for t in range(T):
            out[t, r] = acc[t]


@njit(parallel=True, fastmath=True, cache=True)
def _q4(x, data, f16, out, with_min):  # Q4_0 (with_min False) and Q4_1 (True)
    T, n = x.shape
    rows = data.shape[0]
    nb = n // 32
    size = 20 if with_min else 18
    # per-block sums of x, for the min term (Q4_1) or the -8 offset (Q4_0)
    xsum = np.zeros((T, nb), dtype=np.float32)
    for t in range(T):
        for b in range(nb):
            s = np.float32(0.0)
            for j in range(32):
                s += x[t, b * 32 + j]
            xsum[t, b] = s
    for r in prange(rows):
        acc = np.zeros(T, dtype=np.float32)
        for b in range(nb):
            o = b * size
            d = f16[np.int64(data[r, o]) | (np.int64(data[r, o + 1]) << 8)]
            if with_min:
                m = f16[np.int64(data[r, o + 2]) | (np.int64(data[r, o + 3]) << 8)]
                qo = o + 4
            else:
                m = np.float32(-8.0) * d
                qo = o + 2
            for t in range(T):
                s = np.float32(0.0)
                for j in range(16):
                    byte = data[r, qo + j]
                    s += np.float32(byte & 15) * x[t, b * 32 + j]
                    s += np.float32(byte >> 4) * x[t, b * 32 + 16 + j]
                acc[t] += d * s + m * xsum[t, b]
        for t in range(T):
            out[t, r] = acc[t]


@njit(parallel=True, fastmath=True, cache=True)
def _nf4(x, data, table, out):  # 36-byte blocks of 64: absmax f32, then high-nibble-first pairs
    T, n = x.shape
    rows = data.shape[0]
    nb = n // 64
    for r in prange(rows):
        acc = np.zeros(T, dtype=np.float32)
        for b in range(nb):
            o = b * 36
            raw = (np.uint32(data[r, o]) | (np.uint32(data[r, o + 1]) << 8)
                   | (np.uint32(data[r, o + 2]) << 16) | (np.uint32(data[r, o + 3]) << 24))
            absmax = np.array([raw], dtype=np.uint32).view(np.float32)[0]
            for t in range(T):
                s = np.float32(0.0)
                for j in range(32):
                    byte = data[r, o + 4 + j]
                    s += table[byte >> 4] * x[t, b * 64 + 2 * j]
                    s += table[byte & 15] * x[t, b * 64 + 2 * j + 1]
                acc[t] += absmax * s
        for t in range(T):
            out[t, r] = acc[t]


class FusedKernels(ReferenceKernels):
    name = "numba-fused"

    def matmul(self, x: np.ndarray, w: QuantTensor) -> np.ndarray:
        codec = w.codec.name
        if x.shape[0] > FUSED_MAX_TOKENS or codec not in ("q8_0", "q4_0", "q4_1", "nf4"):
            return super().matmul(x, w)
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], w.rows), dtype=np.float32)
        if codec == "q8_0":
            _q8_0(x, w.data, F16_TABLE, out)
        elif codec == "nf4":
            _nf4(x, w.data, NF4_TABLE, out)
        else:
            _q4(x, w.data, F16_TABLE, out, codec == "q4_1")
        return out


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel once."""
    x = np.zeros((1, 64), dtype=np.float32)
    out = np.zeros((1, 1), dtype=np.float32)
    _q8_0(x, np.zeros((1, 68), np.uint8), F16_TABLE, out)
    _q4(x, np.zeros((1, 40), np.uint8), F16_TABLE, out, True)
    _q4(x, np.zeros((1, 36), np.uint8), F16_TABLE, out, False)
    _nf4(x, np.zeros((1, 36), np.uint8), NF4_TABLE, out)
