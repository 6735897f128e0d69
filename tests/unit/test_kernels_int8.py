"""Int8 activations for the K types (Q4_K, Q5_K, Q6_K): integer block dot products against an
independent NumPy evaluation of the block layouts (ggml-common.h), as
test_kernels.py::test_int8_activations_are_integer_dot_products does for the 32-value types."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from test_kernels import _int8_inputs
from test_kernels_kquants import blocks, tensor

from slm.model import kernels_native, packed_copies

GT = gguf.GGMLQuantizationType
K_TYPES = ["Q4_K", "Q5_K", "Q6_K"]


def _f16(a):
    return a.copy().view("<f2")[..., 0].astype(np.float64)


def _k_units(ggml_type, raw: np.ndarray):
    """(d, m, q) of every 16-value unit of raw (rows, bytes per row): d, m float64 (rows, units),
    q int64 (rows, units, 16), value = d * q + m. Q4_K / Q5_K units of 32 values appear as two
    halves with the same d and m."""
    size = gguf.GGML_QUANT_SIZES[ggml_type][1]
    b = raw.reshape(raw.shape[0], -1, size)  # (rows, blocks, bytes)
    rows, nb = b.shape[:2]
    if ggml_type == GT.Q6_K:
        ql, qh = b[..., 0:128].astype(np.int64), b[..., 128:192].astype(np.int64)
        sc = b[..., 192:208].view(np.int8).astype(np.int64)
        q = np.empty((rows, nb, 256), dtype=np.int64)
        for h in range(2):
            lo, hi = ql[..., 64 * h:64 * h + 64], qh[..., 32 * h:32 * h + 32]
            for s in range(4):
                nib = (lo[..., 32 * (s % 2):32 * (s % 2) + 32] >> (4 * (s // 2))) & 15
                q[..., 128 * h + 32 * s:128 * h + 32 * s + 32] = (nib | (((hi >> (2 * s)) & 3) << 4)) - 32
        d = _f16(b[..., 208:210])[..., None] * sc  # (rows, blocks, 16)
        return d.reshape(rows, -1), np.zeros((rows, nb * 16)), q.reshape(rows, -1, 16)
    s = b[..., 4:16].astype(np.int64)
    sc = np.empty((rows, nb, 8), dtype=np.int64)
    mn = np.empty_like(sc)
    for j in range(8):  # ggml's get_scale_min_k4
        if j < 4:
            sc[..., j], mn[..., j] = s[..., j] & 63, s[..., j + 4] & 63
        else:
            sc[..., j] = (s[..., j + 4] & 15) | ((s[..., j - 4] >> 6) << 4)
            mn[..., j] = (s[..., j + 4] >> 4) | ((s[..., j] >> 6) << 4)
    qs_at = 48 if ggml_type == GT.Q5_K else 16
    qs = b[..., qs_at:qs_at + 128].astype(np.int64)
    q = np.empty((rows, nb, 256), dtype=np.int64)
    for j in range(8):
        q[..., 32 * j:32 * j + 32] = (qs[..., 32 * (j // 2):32 * (j // 2) + 32] >> (4 * (j % 2))) & 15
        if ggml_type == GT.Q5_K:
            q[..., 32 * j:32 * j + 32] |= ((b[..., 16:48].astype(np.int64) >> j) & 1) << 4
    d = _f16(b[..., 0:2])[..., None] * sc
    m = -_f16(b[..., 2:4])[..., None] * mn
    twice = lambda a: np.repeat(a.reshape(rows, -1), 2, axis=-1)  # noqa: E731 (32-value units as 16s)
    return twice(d), twice(m), q.reshape(rows, -1, 16)


@pytest.mark.parametrize("name,rows", [(n, 37) for n in K_TYPES] + [("Q4_K", 40), ("Q6_K", 40)])
@pytest.mark.parametrize("tokens", [1, 3, 4, 5, kernels_native.FUSED_MAX_TOKENS])
def test_k_types_take_int8_activations_as_integer_dot_products(name, rows, tokens):
    """Each output is the sum over units of d * dx * (q . qx) (+ m * dx * sum(qx), the rounded sum): the
    integer products exact, against the NumPy evaluation in float64 (adversarial blocks
    included); each row of x alone gives the same bits; the float32 mode gives other ones.
    (Q4_K and Q6_K with rows in eights: the packed kernels, qkernels/rows_q4x8.c, rows_q6kx8.c.)"""
    T = GT[name]
    raw = blocks(T, rows, 768, seed=3)
    w = tensor(T, raw)
    x = np.random.default_rng(tokens).standard_normal((tokens, 768)).astype(np.float32)
    x[0, :32] = 0.0  # a run of zeros: dx = 0
    x[-1, 300] = 40.0  # one large value: its run's other values round to few levels
    kern = kernels_native.NativeKernels()
    kern.set_activations("int8")
    got = kern.matmul(x, w)  # (T, rows)
    assert (id(w) in packed_copies._PACKED) == (rows % 8 == 0)
    d, m, q = _k_units(T, raw)
    qx, dx = _int8_inputs(x)
    qx16 = qx.reshape(tokens, -1, 16)
    dx16 = np.repeat(dx, 2, axis=-1)  # (T, units of 16)
    sums = dx16 * qx16.sum(-1)  # the rounded runs' sums, as the min term takes them
    terms = np.einsum("rui,tui->tru", q, qx16) * d[None] * dx16[:, None] + m[None] * sums[:, None]
    want = terms.sum(-1)
    assert np.all(np.abs(got - want) <= 1e-5 * np.abs(terms).sum(-1) + 1e-30)
    for t in range(tokens):
        assert kern.matmul(x[t:t + 1], w)[0].tobytes() == got[t].tobytes()
    kern.set_activations("float32")
    assert not np.array_equal(kern.matmul(x, w), got)  # the int8 mode was in effect


def test_k_types_int8_results_do_not_depend_on_threads_or_neighbours():
    """A Q4_K_M layer's shape: Q4_K and Q6_K weights sharing one quantized input in one
    product (packed ones among them), at 1 and 2 threads, and each row alone: the same bits."""
    x = np.random.default_rng(5).standard_normal((6, 768)).astype(np.float32)
    ws = [tensor(GT[n], blocks(GT[n], 37 + 4 * i, 768, seed=i)) for i, n in enumerate(["Q5_K", "Q6_K"])]
    ws += [tensor(GT[n], blocks(GT[n], 24, 768, seed=8)) for n in ("Q6_K", "Q4_K")]  # packed
    assert len(ws) == kernels_native.MAX_JOBS  # one fused product
    results = []
    for threads in (1, 2):
        kern = kernels_native.NativeKernels()
        kern.set_threads(threads)
        kern.set_activations("int8")
        results.append(kern.matmul_many(x, ws))
        alone = [kern.matmul_many(x[t:t + 1], ws) for t in range(x.shape[0])]
        for j in range(len(ws)):
            assert np.concatenate([a[j] for a in alone]).tobytes() == results[-1][j].tobytes()
    for one, two in zip(*results):
        assert one.tobytes() == two.tobytes()


@pytest.mark.parametrize("rows", [5, 8])
def test_k_type_int8_passes_nan_through_and_keeps_long_inputs_in_float32(rows):
    """A NaN in x reaches that row's outputs only (as on the float path; 8 rows: packed); a
    prompt's chunk (more rows than the fused kernel takes) over a type outside INT8_LONG_TYPES
    (Q5_K) runs the dequantized BLAS product either way."""
    w = tensor(GT.Q6_K, blocks(GT.Q6_K, rows, 768, seed=1))
    kern = kernels_native.NativeKernels()
    kern.set_activations("int8")
    x = np.random.default_rng(0).standard_normal((2, 768)).astype(np.float32)
    x[1, 100] = np.nan
    y = kern.matmul(x, w)
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all()
    long = np.random.default_rng(1).standard_normal((kernels_native.FUSED_MAX_TOKENS + 1, 768)).astype(np.float32)
    other = tensor(GT.Q5_K, blocks(GT.Q5_K, rows, 768, seed=1))
    want = kernels_native.NativeKernels().matmul(long, other)
    assert kern.matmul(long, other).tobytes() == want.tobytes()


# ------------------------------------------------------------------ Q4_0 rows packed eight at a time

@pytest.mark.parametrize("name", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("tokens", [1, 3, 5, kernels_native.FUSED_MAX_TOKENS])
def test_packed_q4_rows_are_integer_dot_products(name, tokens):
    """Q4_0 and Q4_1 weights whose rows come in eights take the packed kernel in the int8 mode:
    each output is sum over blocks of d * dx * (q . qx) (+ m * dx * sum(qx), the rounded sum), the integer
    part exact against the NumPy evaluation (adversarial blocks included), and each row of x
    alone gives the same bits."""
    from test_kernels import _int8_codes

    raw = blocks(GT[name], 40, 768, seed=7)
    w = tensor(GT[name], raw)
    x = np.random.default_rng(tokens).standard_normal((tokens, 768)).astype(np.float32)
    x[0, :32] = 0.0  # a block of zeros: dx = 0
    x[-1, 64:96] = -np.abs(x[-1, 64:96]) - 1.0  # a block of negative values: its sum far from 0
    kern = kernels_native.NativeKernels()
    kern.set_activations("int8")
    got = kern.matmul(x, w)
    assert id(w) in packed_copies._PACKED  # the packed kernel took it (built it)
    d, m, q = _int8_codes(GT[name], raw)
    qx, dx = _int8_inputs(x)
    sums = dx * qx.sum(-1)  # the rounded blocks' sums, as the min term takes them
    terms = np.einsum("rbi,tbi->trb", q, qx) * d[None] * dx[:, None] + m[None] * sums[:, None]
    assert np.all(np.abs(got - terms.sum(-1)) <= 1e-5 * np.abs(terms).sum(-1) + 1e-30)
    for t in range(tokens):
        assert kern.matmul(x[t:t + 1], w)[0].tobytes() == got[t].tobytes()


def test_packed_q4_0_results_do_not_depend_on_threads_batches_or_the_rows_each_thread_takes():
    """Groups of eight rows split between threads (sizes whose halves are not multiples of
    eight), at 1 and 2 threads, in one product with an unpacked weight, and as the batch
    kernel's rows (matmul_rows): the same bits; a NaN in x reaches its row only."""
    x = np.random.default_rng(9).standard_normal((4, 512)).astype(np.float32)
    ws = [tensor(GT.Q4_0, blocks(GT.Q4_0, rows, 512, seed=rows)) for rows in (24, 40, 8)]
    ws.append(tensor(GT.Q4_1, blocks(GT.Q4_1, 13, 512, seed=2)))
    outs = []
    for threads in (1, 2):
        kern = kernels_native.NativeKernels()
        kern.set_threads(threads)
        kern.set_activations("int8")
        outs.append(kern.matmul_many(x, ws))
        batch = kern.matmul_rows(x, ws, [[None] * len(x) for _ in ws])
        for a, b in zip(outs[-1], batch):
            assert a.tobytes() == b.tobytes()
    for one, two in zip(*outs):
        assert one.tobytes() == two.tobytes()
    x[2, 7] = np.nan
    y = kern.matmul(x, ws[1])
    assert np.isnan(y[2]).all() and np.isfinite(np.delete(y, 2, axis=0)).all()


def test_the_float32_mode_never_reads_the_packed_rows():
    """The packed copy is the int8 mode's alone: float32 products of a weight that has one give
    the bits of a weight that never had one."""
    raw = blocks(GT.Q4_0, 16, 256, seed=4)
    x = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)
    fresh = kernels_native.NativeKernels().matmul(x, tensor(GT.Q4_0, raw))
    w = tensor(GT.Q4_0, raw)
    kern = kernels_native.NativeKernels()
    kern.set_activations("int8")
    kern.matmul(x, w)
    kern.set_activations("float32")
    assert packed_copies.packed(w) is not None
    assert kern.matmul(x, w).tobytes() == fresh.tobytes()


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q4_K", "Q6_K"])
def test_prompt_chunks_take_the_packed_int8_kernels_row_for_row(name):
    """In the int8 mode a prompt's chunk (more rows than FUSED_MAX_TOKENS) over Q4_0, Q4_1,
    Q4_K or Q6_K takes the packed int8 kernel, not the float32 BLAS product: each row's bits are those
    of the same row in a short input; a Q5_K weight in the same call keeps the BLAS product."""
    q = tensor(GT[name], blocks(GT[name], 40, 512, seed=3))
    head = tensor(GT.Q5_K, blocks(GT.Q5_K, 16, 512, seed=4))
    x = np.random.default_rng(2).standard_normal((3 * kernels_native.FUSED_MAX_TOKENS + 5, 512)).astype(np.float32)
    kern = kernels_native.NativeKernels()
    floats = kern.matmul_many(x, [q, head])
    kern.set_activations("int8")
    got = kern.matmul_many(x, [q, head])
    short = np.concatenate([kern.matmul(x[i:i + 8], q) for i in range(0, len(x), 8)])
    assert got[0].tobytes() == short.tobytes()
    assert not np.array_equal(got[0], floats[0])
    assert got[1].tobytes() == floats[1].tobytes()


def _resident_bytes(address: int) -> int | None:
    """Rss of the mapping holding address, from /proc/self/smaps (None where there is none)."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "Rss:":
            return int(line.split()[1]) * 1024
    return None


def test_packing_a_file_mapped_weight_releases_its_pages_and_keeps_its_bytes(tmp_path):
    """A weight read from a file mapping (as a base's blobs are): once packed, its own pages
    leave the process's resident memory, and what it reads afterwards (the float32 mode) is
    still its bytes, bit for bit."""
    import mmap

    from slm.model.weights import QuantTensor

    raw = blocks(GT.Q4_0, 512, 1024, seed=6)
    path = tmp_path / "w.bin"
    path.write_bytes(raw.tobytes())
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    data = np.frombuffer(mapped, dtype=np.uint8).reshape(raw.shape)
    w = QuantTensor("w", (512, 1024), tensor(GT.Q4_0, raw).codec, data)
    x = np.random.default_rng(3).standard_normal((2, 1024)).astype(np.float32)
    kern = kernels_native.NativeKernels()
    want = kern.matmul(x, w)  # float32: every page read
    before = _resident_bytes(data.ctypes.data)
    if before is None:
        pytest.skip("no /proc/self/smaps here")
    assert before >= raw.nbytes - 8192
    kern.set_activations("int8")
    kern.matmul(x, w)
    assert _resident_bytes(data.ctypes.data) <= 8192  # (the partial pages at its ends, at most)
    kern.set_activations("float32")
    assert kern.matmul(x, w).tobytes() == want.tobytes()
    del data, w


def test_threads_asking_for_a_packed_copy_at_once_share_one():
    """The server's threads may reach a weight's first int8 product together: one copy is
    built, and every caller (the op path's plans, the fused step) points at that one."""
    from concurrent.futures import ThreadPoolExecutor

    w = tensor(GT.Q4_0, blocks(GT.Q4_0, 64, 2048, seed=5))
    with ThreadPoolExecutor(max_workers=4) as pool:
        copies = list(pool.map(lambda _: packed_copies.packed(w), range(8)))
    assert all(c is copies[0] for c in copies) and copies[0] is packed_copies._PACKED[id(w)]
