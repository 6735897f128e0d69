"""k-quants (Q2_K .. Q6_K): decoding bit-exact with gguf-py, Q4_K / Q6_K quantizing bit-exact
with ggml's C reference (libggml-base from llama-cpp-python), the GGML type table, refusals.

Q5_0 and Q5_1 are tested with the other 32-value block types in test_quant.py.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import quants as gq  # noqa: E402

from quant_fixtures import random_values  # noqa: E402
from slm.quant import GGMLType, QuantError, get_codec, ggml_type_label  # noqa: E402

K_TYPES = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]
QUANTIZING = ["q4_k", "q6_k"]  # the k-quants slm writes
DECODE_ONLY = ["q2_k", "q3_k", "q5_k"]
F16_MAX = 65504.0
F32_MAX = float(np.finfo(np.float32).max)


def bits(a: np.ndarray) -> np.ndarray:
    """float32 bit patterns, so comparisons see signed zeros and NaN payloads."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_decodes_like_gguf(name: str, raw: np.ndarray) -> None:
    """raw: (rows, n_blocks * type_size) bytes; our floats == gguf-py's, bit for bit."""
    codec = get_codec(name)
    shape = (raw.shape[0], raw.shape[1] // codec.type_size * codec.block_size)
    with np.errstate(all="ignore"):  # inf/NaN f16 scales decode to inf/NaN in both
        ref = gq.dequantize(raw, GT[name.upper()])
        ours = codec.dequantize(raw, shape)
    if not np.array_equal(bits(ours), bits(ref)):
        bad = np.flatnonzero((bits(ours) != bits(ref)).reshape(-1, codec.block_size).any(axis=1))
        pytest.fail(f"{name}: {bad.size} super-blocks decode differently from gguf, first {bad[0]}")


# ---------------------------------------------------------------- inputs, fixed seeds


RANDOM = random_values(seed=2024, normal_row=2048)


def adversarial_superblocks() -> dict[str, np.ndarray]:
    """256-value super-blocks aimed at the corners of the k-quant searches."""
    rng = np.random.default_rng(17)
    small = rng.normal(0, 1, 256).astype(np.float32)
    i = np.arange(256)
    blocks = {
        "zeros": np.zeros(256),
        "negative_zeros": np.full(256, -0.0),
        "constant_positive": np.full(256, 3.7),
        "constant_negative": np.full(256, -3.7),
        "one_huge_outlier": np.where(i == 5, 1e30, small),
        "one_huge_negative_outlier": np.where(i == 200, -1e30, small),
        "outlier_in_a_quiet_block": np.where(i == 77, 1000.0, small * 1e-3),
        "f16_max_ramp": np.linspace(-F16_MAX, F16_MAX, 256),
        "f16_max_alternating": np.where(i % 2 == 0, F16_MAX, -F16_MAX),
        "f16_max_and_small": np.where(i % 64 == 0, F16_MAX, small),
        "tiny": np.full(256, 1e-30),
        "tiny_random": small * 1e-20,
        "near_group_eps": np.where(i % 16 == 0, 1e-14, 1e-16),  # around ggml's 1e-15 cut-off
        "subnormals": small * 1e-40,
        "smallest_subnormal": np.full(256, 1e-45) * rng.choice([-1, 0, 1], 256),
        "tiny_and_normal_sub_blocks": np.where(i < 128, small * 1e-30, small),
        "negative_only": -np.abs(small) - 1,
        "positive_only": np.abs(small) + 1,
        "alternating_signs": np.where(i % 2 == 0, 1.0, -1.0) * (np.abs(small) + 0.1),
        "one_hot": np.where(i == 77, 1.0, 0.0),
        "one_hot_negative": np.where(i == 77, -1.0, 0.0),
        "zero_sub_block_then_noise": np.where(i < 32, 0.0, small),
        "integer_ramp": i - 128.0,
        "halves": (i - 128.0) / 2,
        "powers_of_two": 2.0 ** (i % 40 - 20),
        "f32_extremes": np.where(i % 2 == 0, F32_MAX, -F32_MAX),
        "f32_max_and_small": np.where(i == 0, F32_MAX, small),
        "span_overflows": np.where(i < 128, 3e38, -3e38),
    }
    return {k: np.asarray(v, dtype=np.float32) for k, v in blocks.items()}


ADVERSARIAL = adversarial_superblocks()


def test_inputs_cover_a_million_values():
    assert sum(a.size for a in RANDOM.values()) >= 1_000_000


# ---------------------------------------------------------------- decoding vs gguf-py


@pytest.mark.parametrize("name", K_TYPES)
def test_decode_arbitrary_bytes_like_gguf(name):
    # 4096 super-blocks of random bytes (1,048,576 values): every code and scale pattern,
    # and f16 d/dmin that are subnormal, inf or NaN
    codec = get_codec(name)
    raw = np.random.default_rng(31).integers(0, 256, (256, 16 * codec.type_size), dtype=np.uint8)
    assert raw.shape[0] * raw.shape[1] // codec.type_size * codec.block_size >= 1_000_000
    assert_decodes_like_gguf(name, raw)


SPECIAL_F16 = np.array(
    [0.0, -0.0, 1.0, -1.0, F16_MAX, -F16_MAX, 6e-8, 6.1e-5, np.inf, -np.inf, np.nan],
    dtype=np.float16,
)


def d_field_offsets(name: str) -> list[int]:
    """Byte offsets of the f16 scale fields (d, and dmin where the type has one)."""
    fields = {"q2_k": [80, 82], "q3_k": [108], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208]}
    return fields[name]


@pytest.mark.parametrize("name", K_TYPES)
def test_decode_adversarial_bytes_like_gguf(name):
    codec = get_codec(name)
    rng = np.random.default_rng(32)
    n = len(SPECIAL_F16) ** 2
    blocks = rng.integers(0, 256, (n, codec.type_size), dtype=np.uint8)
    # every pair of special values in the f16 scale fields
    offsets = d_field_offsets(name)
    for j, off in enumerate(offsets):
        pick = (np.arange(n) // len(SPECIAL_F16) ** j) % len(SPECIAL_F16)
        blocks[:, off : off + 2] = SPECIAL_F16[pick].view(np.uint8).reshape(n, 2)
    blocks[0] = 0  # all-zero block
    blocks[1] = 0xFF  # all ones: NaN scales, maximal codes
    blocks[2, :] = 0xFF
    for off in offsets:
        blocks[2, off : off + 2] = np.array([1.0], dtype=np.float16).view(np.uint8)  # max codes
    assert_decodes_like_gguf(name, blocks)


@pytest.mark.parametrize("name", QUANTIZING)
@pytest.mark.parametrize("dist", sorted(RANDOM))
def test_decode_of_our_bytes_like_gguf(name, dist):
    assert_decodes_like_gguf(name, get_codec(name).quantize(RANDOM[dist]))


@pytest.mark.parametrize("name", QUANTIZING)
def test_decode_of_our_adversarial_bytes_like_gguf(name):
    x = np.stack(list(ADVERSARIAL.values()))
    with np.errstate(all="ignore"):
        raw = get_codec(name).quantize(x)
    assert_decodes_like_gguf(name, raw)


@pytest.mark.real_model
def test_decode_gemma3_tensors_like_gguf():
    """The k-quant tensors of a real Q4_K_M GGUF (Gemma 3 270M) decode like gguf-py."""
    import gemma3_path

    path = gemma3_path.locate()
    if path is None:
        pytest.skip("Gemma 3 270M is not available")
    seen: dict[str, int] = {}
    for t in gguf.GGUFReader(path).tensors:
        name = t.tensor_type.name.lower()
        if name not in ("q4_k", "q6_k", "q5_0") or seen.get(name, 0) >= 3:
            continue
        seen[name] = seen.get(name, 0) + 1
        raw = np.asarray(t.data).reshape(-1, np.asarray(t.data).shape[-1])[:64]  # first rows
        codec = get_codec(name)
        shape = (raw.shape[0], raw.shape[1] // codec.type_size * codec.block_size)
        np.testing.assert_array_equal(
            bits(codec.dequantize(raw, shape)), bits(gq.dequantize(raw, t.tensor_type)), t.name
        )
    assert set(seen) == {"q4_k", "q6_k", "q5_0"}


# ---------------------------------------------------------------- quantizing vs ggml's C


def _libggml_base() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    lib = Path(spec.origin).parent / "lib" / "libggml-base.so"
    return lib if lib.exists() else None


@pytest.fixture(scope="module")
def ggml_quantize():
    """ggml_quantize_chunk from llama-cpp-python's libggml-base: with imatrix NULL, ggml uses
    quantize_row_q4_K_ref / quantize_row_q6_K_ref for these types."""
    path = _libggml_base()
    if path is None:
        pytest.skip("llama-cpp-python (the oracle extra) is not installed")
    lib = ctypes.CDLL(str(path))
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]

    def quantize(name: str, x: np.ndarray) -> np.ndarray:
        codec = get_codec(name)
        rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])  # (r, n)
        out = np.zeros(codec.byte_shape(rows.shape), dtype=np.uint8)
        written = fn(int(GGMLType[name.upper()]), rows.ctypes.data, out.ctypes.data, 0,
                     rows.shape[0], rows.shape[1], None)
        assert written == out.nbytes
        return out.reshape(codec.byte_shape(x.shape))

    return quantize


def assert_quantizes_like_ggml(ggml_quantize, name: str, x: np.ndarray) -> None:
    codec = get_codec(name)
    with np.errstate(all="ignore"):
        theirs = ggml_quantize(name, x)
        ours = codec.quantize(x)
    assert ours.shape == theirs.shape
    if not np.array_equal(ours, theirs):
        bad = np.flatnonzero((ours != theirs).reshape(-1, codec.type_size).any(axis=1))
        block = np.asarray(x, dtype=np.float32).reshape(-1, codec.block_size)[bad[0]]
        pytest.fail(f"{name}: {bad.size} super-blocks differ from ggml, first: {block!r}")


@pytest.mark.oracle
@pytest.mark.parametrize("name", QUANTIZING)
@pytest.mark.parametrize("dist", sorted(RANDOM))
def test_quantize_bit_exact_with_ggml_on_random_data(ggml_quantize, name, dist):
    assert_quantizes_like_ggml(ggml_quantize, name, RANDOM[dist])


@pytest.mark.oracle
@pytest.mark.parametrize("name", QUANTIZING)
@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_quantize_bit_exact_with_ggml_on_adversarial_block(ggml_quantize, name, case):
    block = ADVERSARIAL[case]
    assert_quantizes_like_ggml(ggml_quantize, name, block)
    assert_quantizes_like_ggml(ggml_quantize, name, np.stack([block, -block, block * 0.5]))


@pytest.mark.oracle
@pytest.mark.parametrize("name", QUANTIZING)
def test_quantize_bit_exact_with_ggml_on_all_adversarial_blocks_and_float64(ggml_quantize, name):
    x = np.stack(list(ADVERSARIAL.values()))  # (n_cases, 256), one tensor
    assert_quantizes_like_ggml(ggml_quantize, name, x)
    # float64 input is converted to float32 first, as llama.cpp's converter does
    x64 = np.random.default_rng(7).normal(0, 3, (8, 512))
    assert_quantizes_like_ggml(ggml_quantize, name, x64)


FINITE_F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
SPECIAL = st.sampled_from(
    [0.0, -0.0, 1e-45, -1e-45, 1e-40, 1e-16, 1e-15, 1e-14, 0.5, -0.5, F16_MAX, -F16_MAX,
     1e30, -1e30, F32_MAX, -F32_MAX]
)


@st.composite
def float32_superblocks(draw):
    """A super-block mixing random magnitudes with special values and runs of one value."""
    base = draw(st.lists(st.one_of(FINITE_F32, SPECIAL), min_size=16, max_size=16))
    reps = draw(st.lists(st.integers(1, 32), min_size=16, max_size=16))
    values = np.repeat(np.array(base, dtype=np.float32), reps)
    return np.resize(values, 256)


@pytest.mark.oracle
@pytest.mark.parametrize("name", QUANTIZING)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(x=float32_superblocks())
def test_hypothesis_quantize_bit_exact_with_ggml(ggml_quantize, name, x):
    assert_quantizes_like_ggml(ggml_quantize, name, x)


# ---------------------------------------------------------------- behaviour without an oracle


@pytest.mark.parametrize(("name", "bound"), [("q4_k", 0.12), ("q6_k", 0.03)])
def test_round_trip_error_is_small_on_normal_weights(name, bound):
    # the searches fit well: RMS error relative to RMS value, on weight-like data
    x = RANDOM["normal"]
    back = get_codec(name).dequantize(get_codec(name).quantize(x), x.shape)
    rel = np.sqrt(np.mean((back - x) ** 2.0) / np.mean(x**2.0))
    assert 0 < rel < bound


@pytest.mark.parametrize("name", QUANTIZING)
def test_zero_super_block_encodes_to_zero_and_decodes_to_zero(name):
    codec = get_codec(name)
    x = np.zeros((2, 256), dtype=np.float32)
    x[1] = np.random.default_rng(1).normal(size=256)
    raw = codec.quantize(x)
    back = codec.dequantize(raw, x.shape)
    assert np.all(back[0] == 0) and np.all(np.isfinite(back))
    if name == "q6_k":  # ggml memsets the whole block
        assert not raw[0].any()


@pytest.mark.parametrize("name", QUANTIZING)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_refused(name, bad):
    x = np.zeros((2, 512), dtype=np.float32)
    x[1, 300] = bad
    with pytest.raises(QuantError, match=f"{name}: cannot quantize non-finite values"):
        get_codec(name).quantize(x)


@pytest.mark.parametrize("name", DECODE_ONLY)
def test_decode_only_types_refuse_to_quantize(name):
    with pytest.raises(QuantError, match=f"{name}: slm reads this type but cannot quantize"):
        get_codec(name).quantize(np.ones((1, 256), dtype=np.float32))


@pytest.mark.parametrize("name", QUANTIZING)
def test_row_length_not_a_multiple_of_256_is_refused(name):
    with pytest.raises(QuantError, match="not a multiple of the block size 256"):
        get_codec(name).quantize(np.ones((2, 128), dtype=np.float32))


@pytest.mark.parametrize("name", K_TYPES)
def test_dequantize_reads_read_only_buffers_and_reuses_out(name):
    codec = get_codec(name)
    raw = np.random.default_rng(9).integers(0, 256, (3, 2 * codec.type_size), dtype=np.uint8)
    shape = (3, 512)
    expected = codec.dequantize(raw, shape)
    ro = np.frombuffer(raw.tobytes(), dtype=np.uint8)
    assert not ro.flags.writeable
    np.testing.assert_array_equal(bits(codec.dequantize(memoryview(ro), shape)), bits(expected))
    out = np.empty(shape, dtype=np.float32)
    assert codec.dequantize_into(raw, shape, out) is out
    np.testing.assert_array_equal(bits(out), bits(expected))
    with pytest.raises(QuantError, match="takes"):
        codec.dequantize(raw.tobytes()[:-1], shape)


def test_large_tensor_spans_several_chunks():
    # more than CHUNK_ELEMENTS values: chunked encoding gives the same bytes as per-row
    x = np.random.default_rng(8).normal(size=(5, 1 << 18)).astype(np.float32)
    codec = get_codec("q4_k")
    whole = codec.quantize(x)
    rows = np.stack([codec.quantize(r) for r in x])
    np.testing.assert_array_equal(whole, rows)


# ---------------------------------------------------------------- GGML type table, refusals


def test_ggml_type_table_matches_gguf_py():
    ours = {t.name: int(t) for t in GGMLType}
    theirs = {t.name: int(t) for t in GT}
    shared = ours.keys() & theirs.keys()
    assert {n: ours[n] for n in shared} == {n: theirs[n] for n in shared}
    assert theirs.keys() <= ours.keys(), "gguf-py knows a type our table lacks"
    assert len(set(ours.values())) == len(ours)


@pytest.mark.parametrize(
    ("type_id", "label"),
    [(16, "IQ2_XXS (id 16)"), (20, "IQ4_NL (id 20)"), (34, "TQ1_0 (id 34)"),
     (35, "TQ2_0 (id 35)"), (15, "Q8_K (id 15)"), (39, "MXFP4 (id 39)"), (4, "unknown (id 4)"),
     (999, "unknown (id 999)")],
)
def test_unsupported_types_are_refused_by_name(type_id, label):
    assert ggml_type_label(type_id) == label
    expected = rf"^unsupported GGML tensor type {re.escape(label)}; supported: .*q4_k"
    with pytest.raises(QuantError, match=expected):
        get_codec(type_id)


def test_unsupported_type_named_by_name_is_refused_by_name():
    with pytest.raises(QuantError, match=r"unsupported GGML tensor type IQ2_XXS \(id 16\)"):
        get_codec("iq2_xxs")
    with pytest.raises(QuantError, match="unknown quantization type 'q7_k'"):
        get_codec("q7_k")
