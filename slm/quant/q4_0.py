"""Q4_0: 32 values as 4-bit codes around 8, one float16 scale (GGML type 2), 18 bytes.

    byte:   0     1     2                  17
          +-----+-----+-----+-----+ ... +-----+
          |  d (f16)  | b0  | b1  |     | b15 |
          +-----+-----+-----+-----+ ... +-----+
    b_j:  | 7 6 5 4 | 3 2 1 0 |
          | q[j+16] |  q[j]   |      (first half of the block in the low nibbles)

    x_i ~= d * (q_i - 8),   q_i in 0..15

The scale is *signed*: d = m / -8 where m is the element of largest magnitude, with its sign
(the first such element on ties). So m itself encodes exactly as q = 0 -> d * -8 = m, and the
asymmetric range -8..7 spends its extra level on m's side.
"""

from __future__ import annotations

import numpy as np

from .base import Codec
from .nibbles import pack_halves, unpack_halves
from .rounding import codes_from_float, reciprocal_or_zero

BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


class Q4_0(Codec):
    name = "q4_0"
    ggml_type = 2
    block_size = 32
    type_size = 18
    block_dtype = BLOCK
    scale_fields = ("d",)

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        k = x.shape[0]
        first_peak = np.abs(x).argmax(axis=1)  # (k,) index of the first max |x|
        peak = x[np.arange(k), first_peak]  # (k,) signed
        d = peak / np.float32(-8)  # (k,) float32
        inv_d = reciprocal_or_zero(d)  # (k,)
        # trunc(v + 8.5) is round-half-up of v, shifted to 0..16; two float32 roundings.
        # (0 * inf = NaN when 1/d overflowed: codes_from_float maps it to 0.)
        shifted = np.trunc(x * inv_d[:, None] + np.float32(8.5))  # (k, 32)
        q = codes_from_float(shifted, 0, 15, np.uint8)  # (k, 32)
        block = out.reshape(-1).view(BLOCK)  # (k,)
        block["d"] = d
        block["qs"] = pack_halves(q)  # (k, 16)

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        k = block.shape[0]
        d = block["d"].astype(np.float32)  # (k,)
        codes = np.empty((k, 2, 16), dtype=np.uint8)
        unpack_halves(block["qs"], codes)  # (k, 2, 16): [low nibbles, high nibbles]
        halves = out.reshape(k, 2, 16)  # view of out matching codes' element order
        np.subtract(codes, np.float32(8), out=halves)  # exact
        np.multiply(halves, d[:, None, None], out=halves)
