"""slm.quant: bit-exactness against gguf-py's reference codecs, round trips, NF4, errors."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import quants as gq  # noqa: E402

from slm.errors import InvalidInput  # noqa: E402
from slm.quant import (  # noqa: E402
    SUPPORTED_GGML_TYPES,
    Codec,
    QuantError,
    by_ggml_type,
    codec_names,
    get_codec,
)
from slm.quant.nf4 import CODEBOOK  # noqa: E402

GGML_BLOCK_TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]
ALL_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "nf4"]
F16_MAX = 65504.0
F32_MAX = float(np.finfo(np.float32).max)


def gguf_type(name: str) -> GT:
    return GT[name.upper()]


def bits(a: np.ndarray) -> np.ndarray:
    """float32 bit patterns, so comparisons see signed zeros and NaN payloads."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_bit_exact(name: str, x: np.ndarray) -> None:
    """Our quantize == gguf's bytes, and our dequantize == gguf's floats, bit for bit."""
    codec, qtype = get_codec(name), gguf_type(name)
    ours = codec.quantize(x)
    with np.errstate(over="ignore"):  # gguf warns when a scale overflows float16
        theirs = gq.quantize(x, qtype)
    assert ours.dtype == np.uint8 and ours.shape == theirs.shape
    if not np.array_equal(ours, theirs):
        bad = np.flatnonzero((ours != theirs).reshape(-1, codec.type_size).any(axis=1))
        block = x.reshape(-1, codec.block_size)[bad[0]]
        pytest.fail(f"{name}: {bad.size} blocks differ from gguf, first: {block!r}")
    with np.errstate(all="ignore"):  # scales that overflowed to inf decode to inf/NaN
        ref = gq.dequantize(theirs, qtype)
    np.testing.assert_array_equal(bits(codec.dequantize(ours, x.shape)), bits(ref))


# ---------------------------------------------------------------- random data, >= 1M values


def random_values(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 1 << 18  # 4 distributions x 262,144 = 1,048,576 values
    log_uniform = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-44, 38, n)
    return {
        "normal": rng.normal(0, 0.02, n).astype(np.float32).reshape(-1, 1024),
        "uniform_wide": rng.uniform(-1e5, 1e5, n).astype(np.float32).reshape(-1, 256),
        "heavy_tailed": rng.standard_t(1.5, n).astype(np.float32).reshape(64, -1),
        # magnitudes from subnormal to near float32 max, so some scales overflow float16
        "log_uniform": log_uniform.astype(np.float32).reshape(-1, 4096),
    }


RANDOM = random_values(seed=1234)


def test_random_inputs_cover_a_million_values():
    assert sum(a.size for a in RANDOM.values()) >= 1_000_000


@pytest.mark.parametrize("name", GGML_BLOCK_TYPES)
@pytest.mark.parametrize("dist", sorted(RANDOM))
def test_bit_exact_with_gguf_on_random_data(name, dist):
    assert_bit_exact(name, RANDOM[dist])


@pytest.mark.parametrize("name", GGML_BLOCK_TYPES)
def test_bit_exact_with_float64_input(name):
    # gguf converts to float32 first; so must we (not quantize from the float64 values)
    x = np.random.default_rng(7).normal(0, 3, (8, 256))  # float64
    assert_bit_exact(name, x)


@pytest.mark.parametrize("name", GGML_BLOCK_TYPES)
def test_dequantize_gguf_produced_bytes(name):
    codec, qtype = get_codec(name), gguf_type(name)
    x = np.random.default_rng(99).normal(0, 1, (128, 512)).astype(np.float32)
    raw = gq.quantize(x, qtype)  # bytes from the reference, not from us
    ref = gq.dequantize(raw, qtype)
    np.testing.assert_array_equal(bits(codec.dequantize(raw, x.shape)), bits(ref))


@pytest.mark.parametrize("name", GGML_BLOCK_TYPES)
def test_dequantize_arbitrary_bytes_like_gguf(name):
    # any bit pattern, including f16 scales that are inf, NaN or subnormal
    codec, qtype = get_codec(name), gguf_type(name)
    raw = np.random.default_rng(5).integers(0, 256, (64, 8 * codec.type_size), dtype=np.uint8)
    shape = (64, 8 * codec.block_size)
    with np.errstate(all="ignore"):
        ref = gq.dequantize(raw, qtype)
    np.testing.assert_array_equal(bits(codec.dequantize(raw, shape)), bits(ref))


# ---------------------------------------------------------------- adversarial blocks


def adversarial_blocks() -> dict[str, np.ndarray]:
    """32-value blocks aimed at the corners of the GGML recipes."""
    rng = np.random.default_rng(3)
    small = rng.normal(0, 1, 32).astype(np.float32)
    i = np.arange(32)
    blocks = {
        "zeros": np.zeros(32),
        "negative_zeros": np.full(32, -0.0),
        "all_equal_positive": np.full(32, 3.7),
        "all_equal_negative": np.full(32, -3.7),
        "all_equal_tiny": np.full(32, 1e-30),
        "huge_outlier": np.where(i == 5, 1e30, small),
        "huge_negative_outlier": np.where(i == 31, -1e30, small),
        "subnormals": rng.choice([-1.0, 1.0], 32) * 1e-40,
        "smallest_subnormal": np.full(32, 1e-45) * rng.choice([-1, 0, 1], 32),
        "inverse_scale_overflow": rng.uniform(-1, 1, 32) * 3e-37,  # 1/d overflows float32
        "near_f16_max": np.linspace(-F16_MAX, F16_MAX, 32),
        "just_above_f16_max": np.full(32, 65519.0) * rng.choice([-1.0, 1.0], 32),
        "f16_overflow_after_scaling": np.linspace(-1, 1, 32) * F16_MAX * 127.5,
        "q4_0_scale_at_f16_max": np.linspace(-1, 1, 32) * F16_MAX * 8,
        "f32_extremes": np.where(i % 2 == 0, F32_MAX, -F32_MAX),
        "f32_max_and_small": np.where(i == 0, F32_MAX, small),
        "min_max_span_overflows": np.where(i < 16, 3e38, -3e38),
        "mixed_signs_negative_peak": np.where(i == 9, -50.0, small * 10),
        # |peak| tie: Q4_0 must take the FIRST one, with its sign
        "equal_magnitude_negative_first": np.where(i == 2, -7.0, np.where(i == 20, 7.0, small)),
        "equal_magnitude_positive_first": np.where(i == 2, 7.0, np.where(i == 20, -7.0, small)),
        # exact halves after scaling: roundf goes away from zero, trunc(v + .5) goes up
        "q8_0_halves": np.concatenate([[127.0], np.arange(-15, 16) + 0.5]),
        "q4_0_halves": np.concatenate([[-8.0], np.linspace(-7.5, 7.5, 31)]),
        "q4_1_halves": np.concatenate([[0.0, 15.0], np.arange(30) / 2]),
        "q5_0_halves": np.concatenate([[-16.0], np.linspace(-15.5, 15.5, 31)]),
        "q5_1_halves": np.concatenate([[0.0, 31.0], np.arange(30) + 0.5]),
        "just_below_half": np.concatenate([[127.0], np.full(31, np.nextafter(np.float32(0.5), 0))]),
        "powers_of_two": 2.0 ** np.arange(-16, 16),
    }
    return {k: np.asarray(v, dtype=np.float32) for k, v in blocks.items()}


ADVERSARIAL = adversarial_blocks()


@pytest.mark.parametrize("name", GGML_BLOCK_TYPES)
@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_bit_exact_with_gguf_on_adversarial_block(name, case):
    block = ADVERSARIAL[case]
    assert block.shape == (32,)
    with np.errstate(all="ignore"):  # gguf itself warns on the overflow cases
        assert_bit_exact(name, block)
        assert_bit_exact(name, np.stack([block, -block, block * 0.5]))  # next to other blocks


def test_all_adversarial_blocks_in_one_tensor():
    x = np.stack(list(ADVERSARIAL.values()))
    with np.errstate(all="ignore"):
        for name in GGML_BLOCK_TYPES:
            assert_bit_exact(name, x)


def test_known_codes_for_hand_built_blocks():
    # Q4_0: the peak -8 gives d = 1; code = trunc(x + 8.5), first half in low nibbles
    x = np.concatenate([[-8.0], np.arange(-7, 8), np.zeros(16)]).astype(np.float32)
    raw = get_codec("q4_0").quantize(x)
    assert raw[:2].view("<f2")[0] == 1.0
    assert list(raw[2:] & 0x0F) == list(range(16))
    assert list(raw[2:] >> 4) == [8] * 16
    # Q8_0: d = 1, roundf rounds halves away from zero
    x = np.concatenate([[127.0, 0.5, -0.5, 1.5, -1.5, 2.5], np.zeros(26)]).astype(np.float32)
    raw = get_codec("q8_0").quantize(x)
    assert list(raw[2:8].view(np.int8)) == [127, 1, -1, 2, -2, 3]


# ---------------------------------------------------------------- hypothesis


FINITE_F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
SPECIAL = st.sampled_from(
    [0.0, -0.0, 1e-45, -1e-45, 1e-40, 1e-38, 3e-37, 0.5, -0.5, 65504.0, -65504.0, 65520.0,
     8 * 65504.0, 127 * 65504.0, 1e30, -1e30, F32_MAX, -F32_MAX]
)


@st.composite
def float32_blocks(draw):
    n_blocks = draw(st.integers(1, 4))
    n = 32 * n_blocks
    values = draw(st.lists(st.one_of(FINITE_F32, SPECIAL), min_size=n, max_size=n))
    return np.array(values, dtype=np.float32).reshape(n_blocks, 32)


@pytest.mark.parametrize("name", GGML_BLOCK_TYPES)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=float32_blocks())
def test_hypothesis_bit_exact_with_gguf(name, x):
    with np.errstate(all="ignore"):
        assert_bit_exact(name, x)


# ---------------------------------------------------------------- float types


def test_f32_round_trip_exact_and_zero_copy():
    codec = get_codec("f32")
    x = RANDOM["log_uniform"][:4]
    raw = codec.quantize(x)
    assert raw.shape == (4, 4096 * 4)
    np.testing.assert_array_equal(raw.view(np.float32), x)
    back = codec.dequantize(memoryview(raw.tobytes()), x.shape)  # read-only buffer
    np.testing.assert_array_equal(bits(back), bits(x))
    assert np.shares_memory(codec.dequantize(raw, x.shape), raw)  # no copy


@pytest.mark.parametrize("dist", sorted(RANDOM))
def test_f16_matches_gguf_and_round_trips(dist):
    codec = get_codec("f16")
    x = RANDOM[dist][:16]
    with np.errstate(over="ignore"):
        ref = gq.quantize(x, GT.F16)  # float16 array
    raw = codec.quantize(x)
    np.testing.assert_array_equal(raw, ref.view(np.uint8))
    expected = gq.dequantize(ref, GT.F16)
    np.testing.assert_array_equal(bits(codec.dequantize(raw, x.shape)), bits(expected))
    # values already representable in f16 survive unchanged
    f16_exact = np.where(np.isfinite(ref), ref, 0).astype(np.float32)
    back = codec.dequantize(codec.quantize(f16_exact), x.shape)
    np.testing.assert_array_equal(bits(back), bits(f16_exact))


def test_f16_float64_input_rounds_once_like_gguf():
    # 1 + 2**-11 + 2**-40 is just above a float16 tie: direct rounding goes up, but through
    # float32 the 2**-40 is lost and the tie rounds to even (down).
    x = np.array([1 + 2**-11 + 2**-40], dtype=np.float64)
    raw = get_codec("f16").quantize(x)
    np.testing.assert_array_equal(raw, gq.quantize(x, GT.F16).view(np.uint8))
    assert raw.view("<f2")[0] == np.float16(1 + 2**-10)


@pytest.mark.parametrize("dist", sorted(RANDOM))
def test_bf16_matches_gguf_and_round_trips(dist):
    codec = get_codec("bf16")
    x = RANDOM[dist][:16]
    raw = codec.quantize(x)
    ref = gq.quantize(x, GT.BF16)
    np.testing.assert_array_equal(raw, ref)
    back = codec.dequantize(raw, x.shape)
    np.testing.assert_array_equal(bits(back), bits(gq.dequantize(ref, GT.BF16)))
    assert not np.any(bits(back) & 0xFFFF)  # bf16 values: low 16 bits of the float32 are zero
    np.testing.assert_array_equal(codec.quantize(back), raw)  # bf16 values are fixed points


def test_bf16_rounds_to_nearest_even_on_bits():
    patterns = {
        0x3F808000: 0x3F80,  # exact tie, kept bit even: stays
        0x3F818000: 0x3F82,  # exact tie, kept bit odd: up to even
        0x3F808001: 0x3F81,  # just above the tie: up
        0x3F807FFF: 0x3F80,  # just below: down
        0x7F7FFFFF: 0x7F80,  # float32 max rounds to bf16 inf, as in gguf
        0x00000001: 0x0000,  # smallest subnormal rounds to zero
        0x80000000: 0x8000,  # -0.0 keeps its sign
    }
    x = np.array(list(patterns), dtype=np.uint32).view(np.float32)
    raw = get_codec("bf16").quantize(x)
    assert [int(v) for v in raw.view("<u2")] == list(patterns.values())
    np.testing.assert_array_equal(raw, gq.quantize(x, GT.BF16))


def test_bf16_nan_handling_matches_gguf_bit_function():
    from slm.quant.float_types import bf16_bits

    # NaNs whose payload sits in the low 16 bits must stay NaN (quiet), not become inf
    nans = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7F80FFFF], dtype=np.uint32)
    ref = np.frombuffer(gq.quantize(nans.view(np.float32), GT.BF16).tobytes(), dtype="<u2")
    np.testing.assert_array_equal(bf16_bits(nans.view(np.float32)), ref)


# ---------------------------------------------------------------- NF4


NF4 = get_codec("nf4")
NF4_MAX_HALF_GAP = float(np.max(np.diff(CODEBOOK.astype(np.float64))) / 2)


def test_nf4_layout_constants():
    assert (NF4.block_size, NF4.type_size, NF4.ggml_type) == (64, 36, None)
    assert NF4.nbytes((3, 128)) == 3 * 2 * 36


@pytest.mark.parametrize("dist", sorted(RANDOM))
def test_nf4_round_trip_error_bound(dist):
    x = RANDOM[dist]
    back = NF4.dequantize(NF4.quantize(x), x.shape)
    absmax = np.abs(x.reshape(-1, 64)).max(axis=1, keepdims=True).astype(np.float64)
    err = np.abs(x.reshape(-1, 64).astype(np.float64) - back.reshape(-1, 64))
    # nearest level => within half the widest gap; float32 products add a few ulps
    assert np.all(err <= absmax * NF4_MAX_HALF_GAP * (1 + 1e-6) + 1e-45)


def test_nf4_reconstructs_codebook_values_exactly():
    rng = np.random.default_rng(11)
    scales = np.float32([1.0, 0.37, 1e-30, 3e38, 2.5e-3])
    blocks = []
    for s in scales:
        codes = rng.integers(0, 16, 64)
        codes[rng.integers(0, 64)] = 15  # make sure 1.0 * s is the block's absmax
        blocks.append(CODEBOOK[codes] * s)
    x = np.stack(blocks)  # (5, 64) float32, each exactly level * absmax
    back = NF4.dequantize(NF4.quantize(x), x.shape)
    np.testing.assert_array_equal(bits(back), bits(x))


def test_nf4_nibble_order_and_layout_on_hand_built_block():
    # element 2i -> high nibble of byte i, element 2i+1 -> low nibble
    codes = np.arange(64) % 16
    x = (CODEBOOK[codes] * np.float32(2.0)).reshape(1, 64)
    raw = NF4.quantize(x)
    assert raw.shape == (1, 36)
    assert raw[0, :4].view("<f4")[0] == 2.0  # absmax first, little-endian float32
    expected = [(codes[2 * i] << 4) | codes[2 * i + 1] for i in range(32)]
    assert list(raw[0, 4:]) == expected
    assert raw[0, 4] == 0x01 and raw[0, 5] == 0x23
    # and decoding a hand-written block: byte 0xF0 -> [+1, -1] * absmax
    block = np.zeros(36, dtype=np.uint8)
    block[:4] = np.frombuffer(np.float32(3.0).tobytes(), dtype=np.uint8)
    block[4:] = 0x77  # both nibbles 7 = level 0.0
    block[4] = 0xF0
    back = NF4.dequantize(block.tobytes(), (64,))
    assert back[0] == 3.0 and back[1] == -3.0 and np.all(back[2:] == 0)


def test_nf4_ties_go_to_the_lower_level():
    # Halfway between 0.0 and its neighbours is exactly representable (half a float32).
    x = np.zeros(64, dtype=np.float32)
    x[0] = 1.0  # absmax 1, so x / absmax is exact
    x[2] = CODEBOOK[8] / 2  # tie between levels 7 (0.0) and 8 -> 7
    x[3] = CODEBOOK[6] / 2  # tie between levels 6 and 7 (0.0) -> 6
    x[4] = np.nextafter(CODEBOOK[8] / 2, np.float32(1))  # just above the tie -> 8
    raw = NF4.quantize(x)
    assert raw[4] >> 4 == 15  # element 0 (after the 4 absmax bytes): level +1.0
    assert raw[5] >> 4 == 7 and raw[5] & 0x0F == 6  # elements 2, 3
    assert raw[6] >> 4 == 8  # element 4


def test_nf4_zero_block_decodes_to_zeros():
    x = np.zeros((2, 64), dtype=np.float32)
    x[1] = np.random.default_rng(2).normal(size=64)
    raw = NF4.quantize(x)
    assert raw[0, :4].view("<f4")[0] == 0.0
    back = NF4.dequantize(raw, x.shape)
    assert np.all(back[0] == 0) and not np.any(np.signbit(back[0]))
    assert np.all(np.isfinite(back))


# ---------------------------------------------------------------- buffers and dequantize_into


@pytest.mark.parametrize("name", ALL_TYPES)
def test_dequantize_accepts_read_only_buffers(name, tmp_path):
    codec = get_codec(name)
    x = np.random.default_rng(4).normal(size=(3, 128)).astype(np.float32)
    raw = codec.quantize(x)
    expected = codec.dequantize(raw, x.shape)
    path = tmp_path / "blob"
    path.write_bytes(b"pad" + raw.tobytes())
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)[3:]  # read-only and unaligned
        got = codec.dequantize(view, x.shape)
        np.testing.assert_array_equal(bits(got), bits(expected))
        del got, view
    ro = np.frombuffer(raw.tobytes(), dtype=np.uint8)
    assert not ro.flags.writeable
    np.testing.assert_array_equal(bits(codec.dequantize(ro, x.shape)), bits(expected))
    from_bytes = codec.dequantize(raw.tobytes(), list(x.shape))
    np.testing.assert_array_equal(bits(from_bytes), bits(expected))


@pytest.mark.parametrize("name", ALL_TYPES)
def test_dequantize_into_reuses_the_output_buffer(name):
    codec = get_codec(name)
    x = np.random.default_rng(6).normal(size=(4, 256)).astype(np.float32)
    raw = codec.quantize(x)
    out = np.full(x.shape, np.nan, dtype=np.float32)
    assert codec.dequantize_into(raw, x.shape, out) is out
    np.testing.assert_array_equal(bits(out), bits(codec.dequantize(raw, x.shape)))
    with pytest.raises(QuantError, match="out must be"):
        codec.dequantize_into(raw, x.shape, np.empty((4, 128), dtype=np.float32))
    with pytest.raises(QuantError, match="out must be"):
        codec.dequantize_into(raw, x.shape, np.empty(x.shape, dtype=np.float64))


def test_large_tensor_spans_several_chunks():
    # more than CHUNK_ELEMENTS values, so quantize/dequantize loop over chunks
    x = np.random.default_rng(8).normal(size=(40, 32768)).astype(np.float32)
    assert_bit_exact("q4_0", x)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_shapes_and_sizes(name):
    codec = get_codec(name)
    for shape in [(codec.block_size * 3,), (2, 5, codec.block_size * 2), (0, codec.block_size)]:
        x = np.ones(shape, dtype=np.float32)
        raw = codec.quantize(x)
        assert raw.dtype == np.uint8
        assert raw.shape == (*shape[:-1], shape[-1] // codec.block_size * codec.type_size)
        assert raw.nbytes == codec.nbytes(shape)
        assert codec.dequantize(raw, shape).shape == shape
        assert codec.dequantize(raw, shape).dtype == np.float32


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("name", ALL_TYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_rejected(name, bad):
    codec = get_codec(name)
    x = np.zeros((2, 2 * codec.block_size), dtype=np.float32)
    x[1, -1] = bad
    with pytest.raises(QuantError, match=f"{name}: cannot quantize non-finite values"):
        codec.quantize(x)


def test_non_finite_message_counts_nan_and_inf():
    x = np.zeros(64, dtype=np.float32)
    x[:3] = np.nan
    with pytest.raises(QuantError) as info:
        get_codec("q4_1").quantize(x)
    assert str(info.value) == "q4_1: cannot quantize non-finite values (3 NaN, 0 inf)"
    x[5] = -np.inf
    with pytest.raises(QuantError, match=r"\(3 NaN, 1 inf\)"):
        get_codec("q4_1").quantize(x)


def test_float64_overflowing_float32_is_reported():
    x = np.zeros(32)
    x[0] = 1e39  # finite in float64, inf in float32
    with pytest.raises(QuantError, match="overflow converting to float32"):
        get_codec("q8_0").quantize(x)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_wrong_byte_length_is_rejected(name):
    codec = get_codec(name)
    shape = (2, codec.block_size * 2)
    raw = codec.quantize(np.ones(shape, dtype=np.float32)).tobytes()
    for data in (raw[:-1], raw + b"\0", b""):
        with pytest.raises(QuantError, match=f"takes {len(raw)} bytes"):
            codec.dequantize(data, shape)
    with pytest.raises(QuantError):
        codec.dequantize(raw, (3, codec.block_size * 2))


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "nf4"])
def test_last_dim_not_multiple_of_block_size_is_rejected(name):
    codec = get_codec(name)
    n = codec.block_size + 1
    with pytest.raises(QuantError, match="not a multiple of the block size"):
        codec.quantize(np.ones((2, n), dtype=np.float32))
    with pytest.raises(QuantError, match="not a multiple"):
        codec.nbytes((2, n))
    with pytest.raises(QuantError, match="not a multiple"):
        codec.dequantize(b"", (n,))


def test_other_bad_inputs_are_rejected():
    with pytest.raises(QuantError, match="0-d"):
        get_codec("f32").quantize(np.float32(1.0))
    with pytest.raises(QuantError, match="dtype"):
        get_codec("q8_0").quantize(np.ones(32, dtype=np.complex64))
    with pytest.raises(QuantError, match="negative"):
        get_codec("q8_0").nbytes((-32,))
    with pytest.raises(QuantError, match="expected bytes"):
        get_codec("q8_0").dequantize(12345, (32,))


# ---------------------------------------------------------------- registry


# Covered in tests/unit/test_quant_kquants.py; listed here so the registry test sees every codec.
MORE_GGML_TYPES = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]


def test_registry_lookup():
    assert codec_names() == sorted(ALL_TYPES + MORE_GGML_TYPES)
    assert SUPPORTED_GGML_TYPES == {
        0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 10: "q2_k",
        11: "q3_k", 12: "q4_k", 13: "q5_k", 14: "q6_k", 30: "bf16",
    }
    for name in ALL_TYPES + MORE_GGML_TYPES:
        codec = get_codec(name)
        assert isinstance(codec, Codec) and codec.name == name
        assert get_codec(name.upper()) is codec
        if codec.ggml_type is not None:
            assert get_codec(codec.ggml_type) is codec is by_ggml_type(codec.ggml_type)
            assert get_codec(np.int64(codec.ggml_type)) is codec
            block_size, type_size = gguf.GGML_QUANT_SIZES[GT(codec.ggml_type)]
            assert (codec.block_size, codec.type_size) == (block_size, type_size)
            assert GT(codec.ggml_type).name.lower() == name
    assert get_codec(GT.Q4_1).name == "q4_1"
    assert by_ggml_type(16) is None


def test_unknown_codec_lists_supported_names():
    with pytest.raises(QuantError) as info:
        get_codec("q7_k")
    for name in ALL_TYPES:
        assert name in str(info.value)
    with pytest.raises(QuantError, match=r"unsupported GGML tensor type IQ2_XXS \(id 16\).*q4_0"):
        get_codec(16)
    with pytest.raises(QuantError):
        get_codec(True)
    with pytest.raises(QuantError):
        get_codec(None)


def test_quant_error_is_a_value_error_and_an_slm_input_error():
    assert issubclass(QuantError, ValueError)
    assert issubclass(QuantError, InvalidInput)


def test_subclass_registration_rules():
    class Helper(Codec):  # no name of its own: a helper base, not registered
        pass

    assert "helper" not in codec_names()
    with pytest.raises(TypeError, match="must implement"):

        class Incomplete(Codec):
            name = "incomplete"
            ggml_type = None
            block_size = 1
            type_size = 1

    assert "incomplete" not in codec_names()


# ------------------------------------------------------------ the numpy-free layout table

def test_the_layout_table_agrees_with_every_codec():
    """slm.quant.layouts (what an activation uses, without the codecs) is the codecs' layouts:
    the same types, the same bytes for every shape a type can hold."""
    from slm.quant.layouts import LAYOUTS, stored_bytes

    assert set(LAYOUTS) == set(codec_names())
    for name in codec_names():
        codec = get_codec(name)
        assert LAYOUTS[name] == (codec.block_size, codec.type_size)
        for shape in [(codec.block_size,), (3, 2 * codec.block_size), (2, 5, 4 * codec.block_size)]:
            assert stored_bytes(name, shape) == codec.nbytes(shape)


@pytest.mark.parametrize("dtype, shape", [("q4_1", (3, 33)), ("q6_k", (2, 128)), ("iq2_xxs", (1, 256)),
                                          ("nope", (4,)), ("f32", ())])
def test_stored_bytes_refuses_with_the_codecs_own_error(dtype, shape):
    from slm.quant.layouts import stored_bytes

    with pytest.raises(QuantError) as ours:
        stored_bytes(dtype, shape)
    with pytest.raises(QuantError) as theirs:
        get_codec(dtype).nbytes(shape)
    assert str(ours.value) == str(theirs.value)


def test_a_codec_whose_layout_disagrees_with_the_table_does_not_register():
    from slm.quant import registry

    class Wrong:
        name, ggml_type, block_size, type_size = "q4_1", None, 32, 21

    with pytest.raises(TypeError, match="layouts"):
        registry.register(Wrong())


def test_importing_the_package_imports_no_codec_until_one_is_asked_for():
    import subprocess
    import sys

    probe = ("import sys; import slm.quant, slm.quant.layouts, slm.quant.errors; "
             "print('numpy' in sys.modules); from slm.quant import get_codec; "
             "print(get_codec('q4_1').type_size, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "20", "True"], out.stderr
