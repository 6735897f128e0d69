"""The prompt's int8 GEMM over the packed layouts (qkernels/gemm_packed.c, rows_q5x8.c): the
integer part exact against NumPy, every row of a chunk the bits of the one-token product, at
every tile remainder (tokens not a multiple of four, odd chunk sizes, groups split between
threads)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from test_kernels import _int8_codes, _int8_inputs
from test_kernels_int8 import _k_units
from test_kernels_kquants import blocks, tensor

from slm.model import kernels_native, packed_copies

GT = gguf.GGMLQuantizationType
PACKED = ["Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"]
LONG = kernels_native.FUSED_MAX_TOKENS  # a chunk longer than this is a prompt's


def _int8_kernels(threads: int = 1) -> kernels_native.NativeKernels:
    kern = kernels_native.NativeKernels()
    kern.set_threads(threads)
    kern.set_activations("int8")
    return kern


def _inputs(tokens: int, n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((tokens, n)).astype(np.float32)
    x[0, :32] = 0.0  # a block of zeros: dx = 0
    x[-1, 64:96] = -np.abs(x[-1, 64:96]) - 1.0  # a block far from zero mean: a large code offset
    x[tokens // 2, 200] = 60.0  # one large value: its block's others round to few levels
    return x


def _reference(name: str, raw: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(want, scale): the NumPy float64 evaluation of the int8 mode's definition (integer dot
    products per block or unit, times d * dx, plus m times the rounded x sums), and the sum of
    the terms' magnitudes (the bound of float32 rounding)."""
    T = GT[name]
    qx, dx = _int8_inputs(x)
    if name in ("Q4_K", "Q6_K"):
        d, m, q = _k_units(T, raw)
        qx, dx = qx.reshape(len(x), -1, 16), np.repeat(dx, 2, axis=-1)
    else:
        d, m, q = _int8_codes(T, raw)
    sums = dx * qx.sum(-1)
    terms = np.einsum("rbi,tbi->trb", q, qx) * d[None] * dx[:, None] + m[None] * sums[:, None]
    return terms.sum(-1), np.abs(terms).sum(-1)


@pytest.mark.parametrize("name", PACKED)
@pytest.mark.parametrize("tokens", [LONG + 1, LONG + 2, LONG + 3, 2 * LONG + 4, 67])
def test_prompt_chunks_over_packed_rows_are_the_integer_dot_products(name, tokens):
    """A prompt's chunk (tokens of every remainder modulo four) over a packed weight (40 rows:
    five groups of eight; adversarial blocks: zero rows, maximal codes and scales) takes the
    packed GEMM, and each output is the int8 mode's definition within float32 rounding of its
    terms: the integer products exact."""
    raw = blocks(GT[name], 40, 768, seed=11)
    w = tensor(GT[name], raw)
    x = _inputs(tokens, 768, seed=tokens)
    got = _int8_kernels().matmul(x, w)
    assert id(w) in packed_copies._PACKED  # the packed kernel took it
    want, scale = _reference(name, raw, x)
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30)


@pytest.mark.parametrize("name", PACKED)
def test_every_row_of_a_prompt_chunk_has_the_bits_of_the_one_token_product(name):
    """The GEMM (four rows of x at a time) and the one-token GEMV give each row the same bits:
    an odd chunk (a remainder of three rows), rows 0..N of it alone, in pairs, in threes."""
    w = tensor(GT[name], blocks(GT[name], 24, 512, seed=5))
    x = _inputs(2 * LONG + 7, 512, seed=3)
    kern = _int8_kernels()
    chunk = kern.matmul(x, w)
    one = np.concatenate([kern.matmul(x[t:t + 1], w) for t in range(len(x))])
    assert chunk.tobytes() == one.tobytes()
    for size in (2, 3, 5):
        parts = np.concatenate([kern.matmul(x[t:t + size], w) for t in range(0, len(x), size)])
        assert parts.tobytes() == chunk.tobytes()


def test_prompt_chunk_results_do_not_depend_on_threads_or_the_other_weights_of_the_product():
    """Packed weights of every type in one product (the groups split between two threads where
    a thread's share is not a whole number of groups), at one and two threads: the same bits,
    and each weight's bits those it gets alone."""
    names = ["Q5_0", "Q4_K", "Q6_K", "Q4_0"]
    ws = [tensor(GT[n], blocks(GT[n], 8 * (3 + i), 512, seed=i)) for i, n in enumerate(names)]
    x = _inputs(LONG + 9, 512, seed=8)
    results = []
    for threads in (1, 2):
        kern = _int8_kernels(threads)
        results.append(kern.matmul_many(x, ws))
        for w, got in zip(ws, results[-1]):
            assert kern.matmul(x, w).tobytes() == got.tobytes()
    for one, two in zip(*results):
        assert one.tobytes() == two.tobytes()


def test_q5_0_weights_are_packed_and_their_decode_rows_match_the_batch_kernel():
    """Q5_0 (Gemma 3's q, k, gate and up) has a packed layout of its own; the batch kernel
    (matmul_rows, the server's decode step) gives each row the bits of the plain product, and a
    NaN in x reaches its row only."""
    w = tensor(GT.Q5_0, blocks(GT.Q5_0, 16, 256, seed=2))
    assert kernels_native.LIB.slm_packed_bytes(6, 16, w.data.strides[0], 256) == w.data.nbytes
    x = _inputs(5, 256, seed=1)
    kern = _int8_kernels()
    plain = kern.matmul(x, w)
    assert id(w) in packed_copies._PACKED
    assert kern.matmul_rows(x, [w], [[None] * len(x)])[0].tobytes() == plain.tobytes()
    x[2, 9] = np.nan
    y = kern.matmul(x, w)
    assert np.isnan(y[2]).all() and np.isfinite(np.delete(y, 2, axis=0)).all()


def test_q5_0_rows_not_in_eights_keep_the_row_by_row_int8_kernel():
    """13 rows have no packed layout: the product still gives the int8 mode's definition, for a
    prompt's chunk as for one token."""
    raw = blocks(GT.Q5_0, 13, 256, seed=9)
    w = tensor(GT.Q5_0, raw)
    x = _inputs(LONG + 2, 256, seed=4)
    got = _int8_kernels().matmul(x, w)
    assert id(w) not in packed_copies._PACKED
    want, scale = _reference("Q5_0", raw, x)
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30)
