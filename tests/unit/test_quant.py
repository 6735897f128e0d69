"""slm.quant against gguf-py's reference codecs: the 32-value block types bit for bit (random
data, adversarial blocks, hypothesis) and the float types, with their round trips.

NF4 is tested in test_quant_nf4.py; buffers, errors and the registry in test_quant_codec_interface.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import quants as gq  # noqa: E402

from quant_fixtures import (  # noqa: E402
    F16_MAX,
    F32_MAX,
    GGML_BLOCK_TYPES,
    RANDOM,
    assert_bit_exact,
    bits,
    gguf_type,
)
from slm.quant import get_codec  # noqa: E402


# ---------------------------------------------------------------- random data, >= 1M values


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
