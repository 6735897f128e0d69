"""The fused C kernels (slm/model/_qkernels.c), called through ctypes.

`matmul(x, w)` for up to FUSED_MAX_TOKENS input rows decodes each weight row into a small
float buffer and dots it with every input row, rows split over all cores (OpenMP); it never
materialises a float32 weight matrix. `matmul_many` multiplies one input by several weights
in one parallel region (q, k, v; gate, up), so a decode step wakes the threads 4 times per
layer instead of 7. Longer batches (a prompt's prefill) dequantize bounded chunks with the C
decoder and multiply them with BLAS, two chunks at a time on two threads.

The NumPy reference path (slm.model.kernels) stays the ground truth: tests/test_kernels.py
differential-tests the two on every type (1e-5 relative). ctypes releases the GIL for every
call, which is what lets the prefill threads overlap.
"""

from __future__ import annotations

import ctypes
import importlib.util
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from slm.model.kernels import ReferenceKernels
from slm.model.weights import QuantTensor

TYPE_CODES = {"q8_0": 0, "q4_0": 1, "q4_1": 2, "nf4": 3}
FUSED_MAX_TOKENS = 8  # above this, dequantize + BLAS is faster
MAX_JOBS = 4  # SLM_MAX_JOBS in the C file

_i64 = ctypes.c_int64
_ptr = ctypes.c_void_p


def _load() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("slm.model._qkernels")
    if spec is None or not spec.origin:
        return None
    lib = ctypes.CDLL(spec.origin)
    lib.slm_matmul.restype = ctypes.c_int
    lib.slm_matmul.argtypes = [ctypes.c_int, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64]
    lib.slm_dequantize.restype = ctypes.c_int
    lib.slm_dequantize.argtypes = [ctypes.c_int, _ptr, _i64, _i64, _i64, _i64, _ptr]
    lib.slm_threads.restype = ctypes.c_int
    return lib


LIB = _load()


def available() -> bool:
    return LIB is not None


def supports(w: QuantTensor) -> bool:
    return w.codec.name in TYPE_CODES


class NativeKernels(ReferenceKernels):
    name = "c-fused"

    def __init__(self, scratch_elems: int | None = None):
        if LIB is None:
            raise ImportError("slm's C kernels are not built (slm/model/_qkernels.c)")
        super().__init__(*(() if scratch_elems is None else (scratch_elems,)))
        self.threads = max(1, LIB.slm_threads())
        self.scratch2 = np.empty_like(self.scratch)  # the second prefill thread's chunk
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="slm-prefill")

    def matmul(self, x: np.ndarray, w: QuantTensor) -> np.ndarray:
        return self.matmul_many(x, [w])[0]

    def matmul_many(self, x: np.ndarray, weights: list[QuantTensor]) -> list[np.ndarray]:
        """[x @ w.T for w in weights], the short-batch ones in one parallel region."""
        x = np.ascontiguousarray(x, dtype=np.float32)  # (T, in)
        if x.shape[0] > FUSED_MAX_TOKENS or len(weights) > MAX_JOBS or \
                not all(supports(w) for w in weights):
            return [self._long(x, w) for w in weights]
        tokens, cols = x.shape
        outs = [np.empty((tokens, w.rows), dtype=np.float32) for w in weights]  # (T, out) each
        for w in weights:
            assert w.cols == cols, (w.name, x.shape, w.shape)
        count = len(weights)
        types = (ctypes.c_int * count)(*(TYPE_CODES[w.codec.name] for w in weights))
        data = (_ptr * count)(*(w.data.ctypes.data for w in weights))
        rows = (_i64 * count)(*(w.rows for w in weights))
        row_bytes = (_i64 * count)(*(w.data.strides[0] for w in weights))
        out_ptrs = (_ptr * count)(*(o.ctypes.data for o in outs))
        ld = (_i64 * count)(*(w.rows for w in weights))
        status = LIB.slm_matmul(count, types, data, rows, row_bytes, out_ptrs, ld, x.ctypes.data, tokens, cols)
        if status != 0:
            raise MemoryError(f"slm_matmul failed ({status})")
        return outs

    def map_parallel(self, fn, items: list) -> list:
        futures = [self.pool.submit(fn, i) for i in items[1:]]
        return [fn(items[0])] + [f.result() for f in futures] if items else []

    def _long(self, x: np.ndarray, w: QuantTensor) -> np.ndarray:
        """Dequantize bounded row chunks (C) and multiply them with BLAS, on two threads."""
        if not supports(w):
            return super().matmul(x, w)
        tokens, cols = x.shape
        assert cols == w.cols, (w.name, x.shape, w.shape)
        out = np.empty((tokens, w.rows), dtype=np.float32)  # (T, out)
        # an even number of chunks, each within a scratch buffer, so both threads work
        step = max(1, min(-(-w.rows // 2), self.scratch.size // cols))
        code = TYPE_CODES[w.codec.name]

        def chunk(start: int, scratch: np.ndarray) -> None:
            stop = min(w.rows, start + step)
            buf = scratch[: (stop - start) * cols].reshape(stop - start, cols)  # (rows_chunk, in)
            LIB.slm_dequantize(code, w.data.ctypes.data, w.data.strides[0], start, stop, cols, buf.ctypes.data)
            np.matmul(x, buf.T, out=out[:, start:stop])  # (T, rows_chunk)

        starts = list(range(0, w.rows, step))
        for i in range(0, len(starts), 2):
            pair = starts[i:i + 2]
            if len(pair) == 1:
                chunk(pair[0], self.scratch)
                continue
            second = self.pool.submit(chunk, pair[1], self.scratch2)
            chunk(pair[0], self.scratch)
            second.result()
        return out

