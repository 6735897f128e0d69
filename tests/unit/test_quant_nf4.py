"""slm.quant's NF4 codec (no gguf counterpart): its layout, round-trip error bound, exact
codebook values, nibble order and ties."""

from __future__ import annotations

import numpy as np
import pytest

from quant_fixtures import RANDOM, bits
from slm.quant import get_codec
from slm.quant.nf4 import CODEBOOK


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
