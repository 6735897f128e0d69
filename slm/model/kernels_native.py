"""The fused C kernels (slm/model/_qkernels.c and the sources it includes, slm/model/qkernels/;
docs/kernels.md maps them), called through ctypes.

`matmul_many(x, weights, low_rank)` multiplies one input (T <= FUSED_MAX_TOKENS rows) by
several quantized weights (q, k, v; gate, up) in one parallel region; no float32 weight matrix
is ever built. A weight's LoRA overlays, passed as one low-rank pair, are added in the same
parallel region. (A decode step of a composition the native step takes does not come here
op by op: slm.model.step_native runs all its layers in one call, over the same C functions.)
Longer batches (a prompt's prefill) dequantize bounded chunks with the C decoder and
multiply them with BLAS, two chunks at a time on two threads.

A weight reaches the C kernels by its codec's GGML type id (NF4, which has none, by slm's
own), and the C side says which types it has: a type it has works as soon as slm.quant has a
codec with that id; every other type (F32, F16, BF16, ...) takes the NumPy reference path
(slm.model.kernels), which stays the ground truth: tests/unit/test_kernels.py and
tests/unit/test_kernels_kquants.py differential-test the two on every type the C side has (1e-5
relative). ctypes releases the GIL for every call, which is what lets the prefill threads
overlap.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from slm.model import mathops
from slm.model.kernel_choice import ACTIVATION_MODES, library_path
from slm.model.kernels import KernelArgumentError, ReferenceKernels, check_width
from slm.model.prefill_pool import PrefillPool
from slm.model.weights import QuantTensor

OWN_TYPE_IDS = {"nf4": 1024}  # the C kernels' ids of types without a GGML id (T_NF4 in qkernels/blocks.h)
# Inputs of up to this many rows take the fused kernels; longer ones (a prompt's) dequantize
# bounded chunks for BLAS, whose fixed cost of dequantizing every weight of a model once only
# pays off for longer inputs: up to this many rows the fused kernels were faster on AVX-512
# and AVX2 builds and on both SmolLM2 and Gemma 3.
FUSED_MAX_TOKENS = 32
MAX_JOBS = 4  # SLM_MAX_JOBS in qkernels/matmul.c
# In the int8 mode, inputs longer than FUSED_MAX_TOKENS (a prompt's chunks) still take the fused
# kernel for these types, packed (T_Q4_0, T_Q4_1, T_Q5_0, T_Q4_K, T_Q6_K), through the packed GEMM
# (qkernels/gemm_packed.c): over the dequantized BLAS product it saves the dequantization and
# multiplies int8, and BLAS would read the weight's own pages again, which the packed copy
# released (packed_copies).
INT8_LONG_TYPES = (2, 3, 6, 12, 14)
# A norm, RoPE or gated activation over at least this many values (a prompt's) is split
# between the two threads: a split costs a thread dispatch, about 30k values' work, so each
# half must be at least that to gain
SPLIT_MIN_VALUES = 65536


class Job(ctypes.Structure):
    """slm_job in qkernels/matmul.c: one weight, its output, and an optional low-rank term."""

    _fields_ = [("type", ctypes.c_int32), ("rank", ctypes.c_int32), ("data", ctypes.c_void_p),
                ("rows", ctypes.c_int64), ("row_bytes", ctypes.c_int64), ("out", ctypes.c_void_p),
                ("lora_a", ctypes.c_void_p), ("lora_bt", ctypes.c_void_p), ("packed", ctypes.c_void_p),
                ("lora_a8", ctypes.c_void_p), ("lora_bt16", ctypes.c_void_p)]


class Term(ctypes.Structure):
    """slm_term in qkernels/matmul.c: one row's low-rank term on one weight (slm_matmul_rows)."""

    _fields_ = [("rank", ctypes.c_int32), ("a", ctypes.c_void_p), ("bt", ctypes.c_void_p),
                ("a8", ctypes.c_void_p), ("bt16", ctypes.c_void_p)]


def term_of(a: np.ndarray, b_t: np.ndarray, int8: bool) -> Term:
    """The descriptor of the low-rank term (A, B^T): the float32 factors and, for a product in
    the int8 mode (int8), the int8 mode's copies of them (slm.model.int8_factors; kept alive
    with A and B^T). The float32 mode never reads the copies, so its descriptors do not make
    them: a composition run only in exact mode holds none."""
    from slm.model.int8_factors import int8_factors

    a8, bt16 = int8_factors(a, b_t) if int8 else (None, None)
    return Term(a.shape[0], a.ctypes.data, b_t.ctypes.data, None if a8 is None else a8.ctypes.data,
                None if bt16 is None else bt16.ctypes.data)


# The C functions' status codes (_qkernels.c): 0 done, -1 an argument it refuses (a shape, a
# type or a job count the Python side should never pass: a bug, not the user's input), -2 it
# could not allocate its scratch memory.
def check_status(status: int, function: str, what: str) -> None:
    if status == -2:
        raise MemoryError(f"{function} ({what}): out of memory for its scratch buffers")
    if status != 0:
        raise RuntimeError(f"{function} ({what}) refused its arguments (status {status}): a bug in slm")

def _load() -> ctypes.CDLL | None:
    path = library_path()
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    signatures = {  # name: (result, arguments), as in _qkernels.c
        "slm_matmul": (i32, [i32, p, p, i64, i64, i32]),
        "slm_matmul_rows": (i32, [i32, p, p, p, i64, i64, i32]),
        "slm_dequantize": (i32, [i32, p, i64, i64, i64, i64, p]),
        "slm_pack": (i32, [i32, p, i64, i64, i64, p]),
        "slm_packed_bytes": (i64, [i32, i64, i64, i64]),
        "slm_block_size": (i32, [i32, p, p]),
        "slm_threads": (i32, []),
        "slm_set_threads": (None, [i32]),
        "slm_rms_norm": (None, [p, p, p, i64, i64, ctypes.c_float]),
        "slm_rope": (None, [p, p, p, p, i64, i64, i64, i32]),
        "slm_attend_one": (i32, [p, p, p, p, i64, i64, i64, i64]),
        "slm_attend_causal": (i32, [p, p, p, p, i64, i64, i64, i64, i64, i64, i64, i64]),
        "slm_attend_causal_team": (i32, [p, p, p, p, i64, i64, i64, i64, i64, i64]),
        "slm_swiglu": (None, [p, p, p, i64]),
        "slm_geglu": (None, [p, p, p, i64]),
    }
    for name, (result, arguments) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = result, arguments
    return lib


LIB = _load()
# OMP_NUM_THREADS, else every core: read once, before any set_threads changes what OpenMP reports
DEFAULT_THREADS = max(1, LIB.slm_threads()) if LIB is not None else 1


def available() -> bool:
    return LIB is not None


@functools.cache
def _block(type_id: int) -> tuple[int, int] | None:
    """(values, bytes) per block of a type the C kernels have, else None."""
    values, size = ctypes.c_int64(), ctypes.c_int64()
    if LIB.slm_block_size(type_id, ctypes.byref(values), ctypes.byref(size)) != 0:
        return None
    return values.value, size.value


def kernel_type(w: QuantTensor) -> int | None:
    """The C kernels' id of w's storage type (its GGML type id), or None when they do not have
    the type or w's rows are not whole blocks of it: the NumPy reference path takes it then."""
    codec = w.codec
    type_id = codec.ggml_type if codec.ggml_type is not None else OWN_TYPE_IDS.get(codec.name)
    block = None if type_id is None or LIB is None else _block(type_id)
    if block is None or w.cols % block[0] or w.data.strides[0] != w.cols // block[0] * block[1]:
        return None
    return type_id


def supports(w: QuantTensor) -> bool:
    return kernel_type(w) is not None


_EMPTY = ctypes.c_char * 0


def _addr(a: np.ndarray) -> int:
    """The address of a C-contiguous array's first byte. `a.ctypes.data` builds a helper
    object, several times dearer than borrowing the buffer, and a decode step asks hundreds of
    times. Read-only arrays cannot lend a ctypes buffer: those take the slow way. Callers pass
    C-contiguous arrays only."""
    try:
        return ctypes.addressof(_EMPTY.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def _f32_c(a: np.ndarray) -> bool:
    return a.dtype == np.float32 and a.flags.c_contiguous


class NativeKernels(ReferenceKernels):
    name = "c-fused"
    fuses_low_rank = True  # matmul_many takes low-rank terms (slm.model.llama)

    def __init__(self, scratch_elems: int | None = None):
        if LIB is None:
            raise ImportError("slm's C kernels are not built (slm/model/_qkernels.c)")
        super().__init__(*(() if scratch_elems is None else (scratch_elems,)))
        self.scratch2 = self.pool = None
        # OMP_NUM_THREADS (or set_threads) = 1, advised on a shared machine, also keeps the
        # prefill on one thread
        self.set_threads(DEFAULT_THREADS)
        self._jobs: dict[tuple, tuple] = {}  # see _plan
        self._terms: dict[tuple, tuple] = {}  # see _row_terms
        self.int8 = False  # see set_activations

    def set_activations(self, mode: str) -> None:
        """"float32" (the exact mode's: every product in float32, within 1e-5 of the reference
        kernels) or "int8" (the default mode's, slm.model.modes): the input of every fused
        product over a block type that takes it (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)
        quantized to int8 per 32 values, the block dot products taken in integers as llama.cpp
        does: faster, logits that move (docs/numerics.md). A new kernel set starts in float32."""
        if mode not in ACTIVATION_MODES:
            raise KernelArgumentError(f"activations {mode!r}: one of {', '.join(ACTIVATION_MODES)}")
        self.int8 = mode == "int8"

    def set_threads(self, n: int) -> None:
        """n threads for the kernels' parallel regions (from this thread) and the prefill."""
        LIB.slm_set_threads(n)
        self.threads = n
        if n > 1 and self.pool is None:
            self.scratch2 = np.empty_like(self.scratch)  # the second prefill thread's chunk
            self.pool = PrefillPool()
        elif n == 1 and self.pool is not None:
            self.pool.shutdown()
            self.scratch2 = self.pool = None

    def matmul(self, x: np.ndarray, w: QuantTensor) -> np.ndarray:
        return self.matmul_many(x, [w])[0]

    def matmul_many(self, x: np.ndarray, weights: list[QuantTensor],
                    low_rank: list | None = None) -> list[np.ndarray]:
        """[x @ w.T (+ (x @ A.T) @ B.T) for each weight]; low_rank: per weight, None or (A (r, in),
        B^T (r, out)) float32 C-ordered, B already scaled."""
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)  # (T, in)
        terms = low_rank or [None] * len(weights)
        take = list(range(len(weights)))  # the weights the fused kernel takes
        if x.shape[0] > FUSED_MAX_TOKENS:  # a prompt's chunk: BLAS, but INT8_LONG_TYPES in the int8 mode
            take = [i for i in take if self.int8 and kernel_type(weights[i]) in INT8_LONG_TYPES]
        plan = self._plan([weights[i] for i in take], [terms[i] for i in take]) if take else None
        fused = dict(zip(take, self._fused(x, plan, weights[0].name))) if plan is not None else {}
        return [fused[i] if i in fused else self._long(x, w, t) for i, (w, t) in enumerate(zip(weights, terms))]

    def _fused(self, x: np.ndarray, plan: tuple, name: str) -> list[np.ndarray]:
        jobs, cols, rows = plan
        check_width(x, cols, name)
        tokens = x.shape[0]
        outs = [np.empty((tokens, r), dtype=np.float32) for r in rows]  # (T, out) each
        for job, out in zip(jobs, outs):
            job.out = _addr(out)
        check_status(LIB.slm_matmul(len(rows), jobs, _addr(x), tokens, cols, self.int8), "slm_matmul", name)
        return outs

    def matmul_rows(self, x: np.ndarray, weights: list[QuantTensor], row_terms: list[list]) -> list[np.ndarray]:
        """matmul_many where each row of x brings its own low-rank terms: row_terms[j][t] is
        None or (A (r, in), B^T (r, out)) for weight j and row t. Any number of rows, always the
        fused kernel (which unpacks each quantized block once for all of them); row t's result
        is bit for bit matmul_many(x[t:t+1], weights, [row_terms[j][t] ...]). The weights must be
        ones the kernel has (supports) and at most MAX_JOBS of one input width."""
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)  # (B, in)
        plan = self._plan(weights, None)
        if plan is None:
            raise KernelArgumentError(f"{weights[0].name}: not a set of weights the batched kernel takes")
        jobs, cols, rows = plan
        tokens = x.shape[0]
        check_width(x, cols, weights[0].name)
        outs = [np.empty((tokens, r), dtype=np.float32) for r in rows]  # (B, out) each
        for job, out in zip(jobs, outs):
            job.out = _addr(out)
        terms = self._row_terms(weights, row_terms, tokens)
        check_status(LIB.slm_matmul_rows(len(rows), jobs, terms, _addr(x), tokens, cols, self.int8), "slm_matmul_rows",
                      weights[0].name)
        return outs

    def _row_terms(self, weights: list[QuantTensor], row_terms: list[list], tokens: int):
        """The (weights x rows) Term array, built once per combination (a batch keeps its rows'
        compositions from step to step) and kept with the arrays it points into."""
        key = (self.int8, tokens, *map(id, weights), *(id(t) for terms in row_terms for t in terms))
        cached = self._terms.get(key)
        if cached is not None:
            return cached[0]
        array = (Term * (len(weights) * tokens))()
        for j, (w, terms) in enumerate(zip(weights, row_terms)):
            if len(terms) != tokens:
                raise KernelArgumentError(f"{w.name}: {len(terms)} low-rank terms for {tokens} rows")
            for t, term in enumerate(terms):
                if term is not None:
                    a, b_t = term
                    if a.shape != (b_t.shape[0], w.cols) or b_t.shape[1] != w.rows:
                        raise KernelArgumentError(f"{w.name}: low-rank term A {a.shape}, B^T {b_t.shape} "
                                                  f"for a {w.rows} x {w.cols} weight")
                    array[j * tokens + t] = term_of(a, b_t, self.int8)
        if len(self._terms) > 4096:  # batches come and go: keep the memory bounded
            self._terms.clear()
        self._terms[key] = (array, row_terms)
        return array

    def _plan(self, weights: list[QuantTensor], low_rank: list | None):
        """(job descriptors, input width, output widths) for these weights and terms, built
        once (only `out` changes per call); None when the fused kernel cannot take them."""
        from slm.model import packed_copies  # (it builds on this module)

        key = (self.int8, *map(id, weights), *map(id, low_rank or ()))
        cached = self._jobs.get(key)
        if cached is not None:
            return cached[0]
        low_rank = low_rank or [None] * len(weights)
        plan, copies = None, []
        if len(weights) <= MAX_JOBS and all(supports(w) and w.cols == weights[0].cols for w in weights):
            jobs = (Job * len(weights))()
            for job, w, term in zip(jobs, weights, low_rank):
                job.type, job.data = kernel_type(w), w.data.ctypes.data
                copies.append(packed_copies.packed(w) if self.int8 else None)
                job.packed = None if copies[-1] is None else copies[-1].ctypes.data
                job.rows, job.row_bytes = w.rows, w.data.strides[0]
                if term is not None:
                    a, b_t = term
                    if not (a.ndim == b_t.ndim == 2 and a.shape == (b_t.shape[0], w.cols) and b_t.shape[1] == w.rows):
                        raise KernelArgumentError(f"{w.name}: low-rank term A {a.shape}, B^T {b_t.shape} "
                                                  f"does not fit the weight {w.shape}")
                    t = term_of(a, b_t, self.int8)
                    job.rank, job.lora_a, job.lora_bt, job.lora_a8, job.lora_bt16 = t.rank, t.a, t.bt, t.a8, t.bt16
            plan = (jobs, weights[0].cols, tuple(w.rows for w in weights))
        # the arrays stay alive with the descriptors that point into them
        self._jobs[key] = (plan, weights, low_rank, copies)
        return plan

    def map_parallel(self, fn, items: list) -> list:
        if self.pool is None or len(items) < 2:
            return [fn(i) for i in items]
        futures = [self.pool.submit(fn, i) for i in items[1:]]
        return [fn(items[0])] + [f.result() for f in futures]

    def _split(self, count: int, values: int, fn) -> None:
        """fn(start, stop) over [0, count) (rows, or values), in two halves on the two threads
        when there are `values` >= SPLIT_MIN_VALUES to compute. In the float32 mode the
        prompt's work is parallel on these threads, as its BLAS products are, never in an
        OpenMP region, whose threads would spin on a core afterwards while the products run.
        (In the int8 mode the products run on the OpenMP team, and so does the attention,
        attend_causal: its share of a prompt's time is far larger than these ops'.)"""
        if self.pool is None or values < SPLIT_MIN_VALUES or count < 2:
            fn(0, count)
        else:
            self.map_parallel(lambda r: fn(*r), [(0, count // 2), (count // 2, count)])

    # The rest of a block in C: in a decode step each replaces 5-30 small NumPy operations (1-3
    # us each); a prompt's are split between the threads. Float32 only; anything else goes to
    # the NumPy definitions. Each row's (value's) result is the C function's whatever the
    # split, so a short batch gets the decode step's bits.
    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        # (the C side trusts shapes: anything unexpected takes the checked NumPy path)
        if not _f32_c(x) or x.ndim != 2 or not _f32_c(weight) or weight.shape != x.shape[1:]:
            return super().rms_norm(x, weight, eps)
        out = np.empty_like(x)  # (T, H)
        src, dst, width = _addr(x), _addr(out), x.shape[1]
        self._split(x.shape[0], x.size, lambda a, b: LIB.slm_rms_norm(
            src + 4 * a * width, _addr(weight), dst + 4 * a * width, b - a, width, eps))
        return out

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, layout: str) -> np.ndarray:
        table = (x.shape[0], x.shape[-1] // 2) if x.ndim == 3 else None
        if not (_f32_c(x) and _f32_c(cos) and _f32_c(sin)) or not cos.shape == sin.shape == table:
            return super().rope(x, cos, sin, layout)
        out = np.empty_like(x)  # (T, heads, hd)
        _, heads, hd = x.shape
        src, dst, c, s = _addr(x), _addr(out), _addr(cos), _addr(sin)
        self._split(x.shape[0], x.size, lambda a, b: LIB.slm_rope(
            src + 4 * a * heads * hd, dst + 4 * a * heads * hd, c + 4 * a * (hd // 2), s + 4 * a * (hd // 2),
            b - a, heads, hd, layout == "gguf"))
        return out

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, first: int) -> np.ndarray:
        if q.ndim != 3 or q.shape[0] != 1 or k.ndim != 3 or k.shape != v.shape or \
                k.shape[2] != q.shape[2] or q.shape[1] % k.shape[1] or not all(_f32_c(a) for a in (q, k, v)):
            return super().attend(q, k, v, first)
        _, nh, hd = q.shape
        out = np.empty((1, nh * hd), dtype=np.float32)
        check_status(LIB.slm_attend_one(_addr(q), _addr(k), _addr(v), _addr(out), k.shape[0], nh,
                                         k.shape[1], hd), "slm_attend_one", "attention")
        return out

    def attends_causally(self) -> bool:
        # (in tiles that share keys: faster than NumPy's dense product at every head size)
        return True

    def attend_causal(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, first: int, window: int) -> np.ndarray:
        """Causal attention of q (T, nh, hd) at positions first.. over k, v (first + T, n_kv, hd),
        within the window (0: none), on the two threads: mathops.attend's result (within
        float32 rounding), in tiles of query rows that share their keys (_qkernels.c). In the
        int8 mode on the OpenMP team that ran the prompt's products (its threads would
        otherwise spin beside these two); the same tiles, the same bits."""
        T, nh, hd = q.shape
        if k.ndim != 3 or k.shape != v.shape or k.shape[0] != first + T or \
                k.shape[2] != hd or nh % k.shape[1] or not all(_f32_c(a) for a in (q, k, v)):
            return mathops.attend(q, k, v, first, window)
        out = np.empty((T, nh * hd), dtype=np.float32)
        if self.int8:  # the prompt's products run on the OpenMP team: so does its attention
            check_status(LIB.slm_attend_causal_team(_addr(q), _addr(k), _addr(v), _addr(out), T, first, window, nh,
                                                    k.shape[1], hd), "slm_attend_causal_team", "attention")
            return out
        parts = 1 if self.pool is None else 2

        def part(i: int) -> int:  # every parts-th tile of the prompt
            return LIB.slm_attend_causal(_addr(q), _addr(k), _addr(v), _addr(out), T, first, window, nh,
                                         k.shape[1], hd, i, parts)

        for status in self.map_parallel(part, list(range(parts))):
            check_status(status, "slm_attend_causal", "attention")
        return out

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self._gated(LIB.slm_swiglu, super().swiglu, gate, up)

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self._gated(LIB.slm_geglu, super().geglu, gate, up)

    def _gated(self, c_function, fallback, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """act(gate) * up (T, F) by the C function on float32, else by `fallback`."""
        if not (_f32_c(gate) and _f32_c(up)) or gate.shape != up.shape:
            return fallback(gate, up)
        out = np.empty_like(gate)  # (T, F)
        g, u, o = _addr(gate), _addr(up), _addr(out)
        self._split(gate.size, gate.size, lambda a, b: c_function(g + 4 * a, u + 4 * a, o + 4 * a, b - a))
        return out

    def _long(self, x: np.ndarray, w: QuantTensor, term: tuple | None) -> np.ndarray:
        """x @ w.T (+ (x @ A.T) @ B^T for a low-rank term): dequantize bounded row chunks (C) and
        multiply them with BLAS, two chunks at a time: one here, one on the pool's thread (each
        BLAS call on one thread); a chunk adds its columns of the low-rank term."""
        code = kernel_type(w)
        if code is None:
            out = super().matmul(x, w)
            if term is not None:
                out += (x @ term[0].T) @ term[1]  # (T, r) @ (r, out)
            return out
        check_width(x, w.cols, w.name)
        tokens, cols = x.shape
        out = np.empty((tokens, w.rows), dtype=np.float32)  # (T, out)
        u = None if term is None else x @ term[0].T  # (T, r)
        # an even number of chunks, each within a scratch buffer, so both threads work
        step = max(1, min(-(-w.rows // 2), self.scratch.size // cols))

        def chunk(start: int, scratch: np.ndarray) -> None:
            stop = min(w.rows, start + step)
            buf = scratch[: (stop - start) * cols].reshape(stop - start, cols)  # (rows_chunk, in)
            check_status(LIB.slm_dequantize(code, w.data.ctypes.data, w.data.strides[0], start, stop, cols,
                                             _addr(buf)), "slm_dequantize", w.name)
            np.matmul(x, buf.T, out=out[:, start:stop])  # (T, rows_chunk)
            if u is not None:
                out[:, start:stop] += u @ term[1][:, start:stop]  # (T, r) @ (r, rows_chunk)

        starts = list(range(0, w.rows, step))
        for i in range(0, len(starts), 2):
            pair = starts[i:i + 2]
            if len(pair) == 1 or self.pool is None:
                for start in pair:
                    chunk(start, self.scratch)
                continue
            second = self.pool.submit(chunk, pair[1], self.scratch2)
            chunk(pair[0], self.scratch)
            second.result()
        return out
