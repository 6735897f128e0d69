"""The C kernels on the block types of k-quant GGUFs (Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
and Q4_0/Q4_1/Q8_0 beside them) against gguf-py's dequantizer, which is bit-exact with ggml's.

The reference is x @ dequantize(W).T in float64. A weight reaches the kernels by its GGML type
id; for a type slm.quant has no codec for, a tensor here carries a stand-in codec over gguf-py
(which the NumPy reference path can use as well).
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from slm import quant  # noqa: E402
from slm.model import kernels_native  # noqa: E402
from slm.model.kernels import ReferenceKernels  # noqa: E402
from slm.model.weights import QuantTensor  # noqa: E402

pytestmark = pytest.mark.skipif(not kernels_native.available(), reason="C kernels not built")

# where the float16 fields of a block are: d, then m or dmin when the type has one
F16_FIELDS = {GT.Q4_0: (0,), GT.Q4_1: (0, 2), GT.Q5_0: (0,), GT.Q5_1: (0, 2), GT.Q8_0: (0,),
              GT.Q2_K: (80, 82), GT.Q3_K: (108,), GT.Q4_K: (0, 2), GT.Q5_K: (0, 2), GT.Q6_K: (208,)}
TYPES = list(F16_FIELDS)
COLS = 768  # three 256-value blocks, 24 of 32
ROWS = 37  # odd: two threads split it unevenly


class GgufCodec:
    """The part of slm.quant.Codec a QuantTensor uses, over gguf-py's dequantizer."""

    def __init__(self, ggml_type: GT):
        self.ggml_type, self.name = int(ggml_type), ggml_type.name.lower()
        self.block_size, self.type_size = GGML_QUANT_SIZES[ggml_type]

    def dequantize_into(self, data, shape, out: np.ndarray) -> np.ndarray:
        out[...] = dequantize(np.asarray(data, dtype=np.uint8), GT(self.ggml_type)).reshape(shape)
        return out

    def dequantize(self, data, shape) -> np.ndarray:
        return self.dequantize_into(data, shape, np.empty(shape, dtype=np.float32))


def tensor(ggml_type: GT, raw: np.ndarray) -> QuantTensor:
    """raw (rows, bytes per row) -> a weight of ggml_type, with slm's codec when it has one."""
    codec = quant.by_ggml_type(ggml_type) or GgufCodec(ggml_type)
    values, size = GGML_QUANT_SIZES[ggml_type]
    return QuantTensor(f"w.{ggml_type.name}", (raw.shape[0], raw.shape[1] // size * values), codec, raw)


def blocks(ggml_type: GT, rows: int, cols: int, seed: int, adversarial: bool = True) -> np.ndarray:
    """(rows, bytes per row) uint8: random bits (every bit pattern is a valid code or scale) with
    float16 fields in a sane range, +-0.02; with `adversarial`, the first rows are
    0: all float16 fields zero (d = 0 and m = 0: the row is exactly zero)
    1: all other bytes 0xff (maximal codes, scales and high bits), the fields positive
    2: all other bytes 0x00 (minimal codes and scales), the fields negative
    3: mins (m, dmin) negative and large against d
    4: d at float16's extremes, +-65504 and the smallest subnormal, by block."""
    values, size = GGML_QUANT_SIZES[ggml_type]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // values, size), dtype=np.uint8)
    fields = list(F16_FIELDS[ggml_type])
    f16 = rng.uniform(-0.02, 0.02, (rows, cols // values, len(fields)))
    if adversarial:
        other = np.setdiff1d(np.arange(size), [o + i for o in fields for i in (0, 1)])
        f16[0] = 0.0
        raw[1][:, other], f16[1] = 0xFF, np.abs(f16[1])
        raw[2][:, other], f16[2] = 0x00, -np.abs(f16[2])
        if len(fields) == 2:
            f16[3, :, 1] = -np.abs(f16[3, :, 1]) * 50
        f16[4, :, 0] = np.resize([65504.0, -65504.0, 2.0**-24, -(2.0**-24)], cols // values)
    for i, offset in enumerate(fields):
        raw[:, :, offset:offset + 2] = f16[..., i:i + 1].astype("<f2").view(np.uint8)
    return raw.reshape(rows, -1)


def reference(x: np.ndarray, ggml_type: GT, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x @ W.T in float64, W dequantized by gguf-py, and |x| @ |W|.T, the size of each sum's
    terms (what float32 rounding errors scale with): both (T, rows)."""
    w = dequantize(raw, ggml_type).astype(np.float64)  # (rows, in)
    x = x.astype(np.float64)  # (T, in)
    return x @ w.T, np.abs(x) @ np.abs(w).T


def assert_close(got: np.ndarray, ref: np.ndarray, scale: np.ndarray) -> None:
    """Within 1e-5 of the size of each sum's terms (a dot product's rounding error grows with
    that, not with its result, which may cancel to near zero; one weight decoded wrong among
    768 is ~1e-3 of it); a row of zero scales gives exactly 0."""
    assert got.dtype == np.float32 and got.shape == ref.shape
    bad = np.abs(got - ref) > 1e-5 * scale
    assert not bad.any(), f"rows {np.unique(np.nonzero(bad)[1])}: {got[bad][:4]} vs {ref[bad][:4]}"


def kernels(threads: int, scratch_elems: int | None = None) -> kernels_native.NativeKernels:
    k = kernels_native.NativeKernels(scratch_elems)
    k.set_threads(threads)
    return k


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("tokens", [1, 3, 12, kernels_native.FUSED_MAX_TOKENS + 1])
def test_matches_gguf_reference(ggml_type, tokens):
    """The fused dequantize-dot (T <= FUSED_MAX_TOKENS: tiles of weight rows by rows of x, 37
    weight rows leaving remainders at both thread counts, 12 rows of x more than one tile) and
    the prefill path (longer: rows dequantized in C in chunks of 5, multiplied with BLAS), on
    random and adversarial blocks, 1 and 2 threads: within 1e-5 of the float64 reference, and the
    same bits at either thread count."""
    raw = blocks(ggml_type, ROWS, COLS, seed=int(ggml_type))
    w = tensor(ggml_type, raw)
    assert kernels_native.kernel_type(w) == int(ggml_type)
    x = np.random.default_rng(tokens).standard_normal((tokens, COLS)).astype(np.float32)
    outs = [kernels(threads, scratch_elems=5 * COLS).matmul(x, w) for threads in (1, 2)]
    assert_close(outs[0], *reference(x, ggml_type, raw))
    assert not outs[0][:, 0].any()  # the zero-scale row
    assert outs[0].tobytes() == outs[1].tobytes()


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_rows_matches_gguf(ggml_type):
    """The prefill's row decoder alone. Where ggml computes a value in one rounding (d * q: no
    min), it gives ggml's bits; with a min (d * q + m), one rounding where ggml takes two, so
    within 2^-23 of the row's largest |value|."""
    raw = blocks(ggml_type, ROWS, COLS, seed=100 + int(ggml_type))
    got = np.empty((ROWS - 3, COLS), dtype=np.float32)
    status = kernels_native.LIB.slm_dequantize(int(ggml_type), raw.ctypes.data, raw.strides[0], 3, ROWS,
                                               COLS, got.ctypes.data)
    assert status == 0
    ref = dequantize(raw[3:], ggml_type)
    if len(F16_FIELDS[ggml_type]) == 1:
        assert got.tobytes() == ref.tobytes()
    else:
        assert (np.abs(got - ref) <= 2.0**-23 * np.abs(ref).max(axis=1, keepdims=True)).all()


def test_several_weights_with_low_rank_terms():
    """q/k/v-style: one input, four weights of different types (Gemma 3's attention mixes Q5_0
    and Q8_0; Q4_K and Q6_K in its feed-forward) in one parallel region, LoRA terms fused on
    three of them: the float64 reference, bit-identical at 1 and 2 threads."""
    rng = np.random.default_rng(5)
    types, rows = [GT.Q5_0, GT.Q8_0, GT.Q4_K, GT.Q6_K], [37, 16, 45, 21]
    raws = [blocks(t, r, COLS, seed=i) for i, (t, r) in enumerate(zip(types, rows))]
    weights = [tensor(t, raw) for t, raw in zip(types, raws)]
    assert all(kernels_native.supports(w) for w in weights)  # so the C kernel adds the terms
    terms = [(rng.standard_normal((4, COLS)).astype(np.float32) / np.sqrt(COLS),  # A (r, in)
              rng.standard_normal((4, r)).astype(np.float32) * 0.1) if i != 1 else None  # B^T (r, out)
             for i, r in enumerate(rows)]
    x = rng.standard_normal((3, COLS)).astype(np.float32)
    runs = [kernels(threads).matmul_many(x, weights, terms) for threads in (1, 2)]
    for out, t, raw, term in zip(runs[0], types, raws, terms):
        ref, scale = reference(x, t, raw)
        if term is not None:
            ref += (x.astype(np.float64) @ term[0].T.astype(np.float64)) @ term[1].astype(np.float64)
        assert_close(out, ref, scale)
    assert [o.tobytes() for o in runs[0]] == [o.tobytes() for o in runs[1]]


def test_types_the_kernels_lack_take_the_reference_path():
    """IQ4_NL (a type the C side does not have, through the gguf stand-in): kernel_type says so
    and the native set's result is the reference path's, bit for bit, decode and prefill."""
    raw = np.random.default_rng(1).integers(0, 256, (ROWS, COLS // 32, 18), dtype=np.uint8)
    raw[:, :, 0:2] = np.full((ROWS, COLS // 32, 1), 0.01, dtype="<f2").view(np.uint8)  # d, then 16 bytes of codes
    raw = raw.reshape(ROWS, -1)
    w = tensor(GT.IQ4_NL, raw)
    assert kernels_native.kernel_type(w) is None
    for tokens in (1, 12):
        x = np.random.default_rng(tokens).standard_normal((tokens, COLS)).astype(np.float32)
        assert kernels(2).matmul(x, w).tobytes() == ReferenceKernels().matmul(x, w).tobytes()


@pytest.mark.real_model
def test_gemma3_tensors():
    """Gemma 3 270M Q4_K_M's own weights, one of each quantized type it has (the Q8_0 one is the
    262144-row embedding, its first 300 rows here): decode and prefill against gguf-py."""
    import gemma3_path  # scripts/, on the path from conftest

    path = gemma3_path.locate()
    if path is None:
        pytest.skip("the Gemma 3 chunk packages are not installed")
    from slm.formats.gguf import read_gguf

    def nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
        values, size = GGML_QUANT_SIZES[GT(ggml_type)]
        return int(np.prod(shape)) // values * size

    wanted = {GT.Q5_0: "blk.0.attn_q.weight", GT.Q4_K: "blk.0.attn_output.weight",
              GT.Q6_K: "blk.0.ffn_down.weight", GT.Q8_0: "token_embd.weight"}
    rng = np.random.default_rng(2)
    with read_gguf(path, nbytes) as g:
        infos = {t.name: t for t in g.tensors}
        for ggml_type, name in wanted.items():
            info = infos[name]
            assert info.ggml_type == ggml_type, (name, info.type_name)
            rows = np.frombuffer(g.tensor_bytes(info), dtype=np.uint8).reshape(info.shape[0], -1)
            raw = rows[:300].copy()  # (300, bytes per row)
            w = tensor(ggml_type, raw)
            assert kernels_native.kernel_type(w) == int(ggml_type)
            for tokens in (1, 12):
                x = rng.standard_normal((tokens, w.cols)).astype(np.float32)
                assert_close(kernels(2).matmul(x, w), *reference(x, ggml_type, raw))
            del rows


@pytest.mark.parametrize("ggml_type", [GT.Q4_K, GT.Q4_1], ids=lambda t: t.name)
@pytest.mark.parametrize("tokens", [1, 8])
def test_the_input_address_does_not_change_the_result(ggml_type, tokens):
    """x at a cache-line boundary and 4, 16 and 32 bytes past one (the kernels copy a
    misaligned x to an aligned block first: vector loads across two lines cost twice): the same
    bits each time."""
    raw = blocks(ggml_type, ROWS, COLS, seed=3)
    w = tensor(ggml_type, raw)
    values = np.random.default_rng(tokens).standard_normal((tokens, COLS)).astype(np.float32)
    room = np.zeros(tokens * COLS + 64, dtype=np.float32)
    first = (-room.ctypes.data % 64) // 4  # the first float on a 64-byte boundary
    outs = []
    for shift in (0, 1, 4, 8):  # floats past the boundary
        x = room[first + shift:first + shift + tokens * COLS].reshape(tokens, COLS)
        x[...] = values
        outs.append(kernels(2).matmul(x, w).tobytes())
    assert outs[1:] == outs[:1] * 3
