"""NF4: QLoRA's 4-bit NormalFloat, 64 values per block with a float32 absmax (not a GGML type).

Our block layout (36 bytes per 64 values):

    byte:   0    1    2    3    4    5          35
          +----+----+----+----+----+----+ ... +----+
          |  absmax (f32, LE) | b0 | b1 |     | b31|
          +----+----+----+----+----+----+ ... +----+
    b_i:  | 7 6 5 4 | 3 2 1 0 |
          |  q[2i]  | q[2i+1] |      (bitsandbytes order: even element in the HIGH nibble)

    x_i ~= CODEBOOK[q_i] * absmax,   absmax = max|x| over the block

Each value is encoded as the codebook entry nearest to x / absmax. An exact tie (x / absmax
exactly halfway between two entries, compared in float64) goes to the LOWER entry (the one
nearer -1), as bitsandbytes' `x > midpoint` decision tree does. A block of zeros has
absmax 0 and decodes to zeros.
"""

from __future__ import annotations

import numpy as np

from .base import Codec
from .nibbles import pack_pairs_high_first

# The 16 NF4 levels (quantiles of N(0, 1) rescaled to [-1, 1], with an exact 0), ascending.
CODEBOOK = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    dtype=np.float32,
)

# Decision boundaries between neighbouring levels. Exact in float64: each is the halfway
# point of two float32 numbers of similar size, so the sum and the halving lose no bits.
MIDPOINTS = (CODEBOOK[:-1].astype(np.float64) + CODEBOOK[1:].astype(np.float64)) / 2  # (15,)

# Decoding table indexed by a whole byte: (high-nibble level, low-nibble level), so one gather
# produces both of a byte's values already in element order.
BYTE_TO_PAIR = np.stack(
    [CODEBOOK[np.arange(256) >> 4], CODEBOOK[np.arange(256) & 0x0F]], axis=1
)  # (256, 2) float32

BLOCK = np.dtype([("absmax", "<f4"), ("qs", "u1", (32,))])


class NF4(Codec):
    name = "nf4"
    ggml_type = None
    block_size = 64
    type_size = 36
    block_dtype = BLOCK
    scale_fields = ("absmax",)

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        absmax = np.abs(x).max(axis=1)  # (k,) float32, stored as is
        # Normalize in float64 so the nearest-level choice is not blurred by float32 rounding.
        unit = np.zeros(x.shape, dtype=np.float64)  # (k, 64) in [-1, 1]; zero blocks stay 0
        np.divide(x, absmax[:, None], out=unit, where=absmax[:, None] > 0)
        # side="left": a value equal to MIDPOINTS[i] gets index i, i.e. the lower level.
        codes = np.searchsorted(MIDPOINTS, unit, side="left").astype(np.uint8)  # (k, 64)
        block = out.reshape(-1).view(BLOCK)  # (k,)
        block["absmax"] = absmax
        block["qs"] = pack_pairs_high_first(codes)  # (k, 32)

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        k = block.shape[0]
        pairs = out.reshape(k, 32, 2)  # view of out: (block, byte, nibble high/low)
        np.take(BYTE_TO_PAIR, block["qs"], axis=0, out=pairs, mode="clip")  # uint8 never clips
        absmax = block["absmax"].astype(np.float32)  # (k,)
        np.multiply(pairs, absmax[:, None, None], out=pairs)
