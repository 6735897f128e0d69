"""Q8_0: 32 values as signed bytes times one float16 scale (GGML type 8), 34 bytes per block.

    byte:   0     1     2     3           33
          +-----+-----+-----+-----+ ... +-----+
          |  d (f16)  | q0  | q1  |     | q31 |      q_i: int8 in [-127, 127]
          +-----+-----+-----+-----+ ... +-----+

    x_i ~= d * q_i,   d = max|x| / 127,   q_i = roundf(x_i / d)  (halves away from zero)
"""

from __future__ import annotations

import numpy as np

from .base import Codec
from .rounding import codes_from_float, reciprocal_or_zero, round_half_away_from_zero

BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])


class Q8_0(Codec):
    name = "q8_0"
    ggml_type = 8
    block_size = 32
    type_size = 34
    block_dtype = BLOCK
    scale_fields = ("d",)

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        amax = np.abs(x).max(axis=1)  # (k,)
        d = amax / np.float32(127)  # (k,) float32; rounded to f16 only when stored
        inv_d = reciprocal_or_zero(d)  # (k,)
        scaled = x * inv_d[:, None]  # (k, 32); 0 * inf = NaN when 1/d overflowed
        q = codes_from_float(round_half_away_from_zero(scaled), -127, 127, np.int8)  # (k, 32)
        block = out.reshape(-1).view(BLOCK)  # (k,) structured view of out
        block["d"] = d
        block["qs"] = q

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        d = block["d"].astype(np.float32)  # (k,)
        np.multiply(block["qs"], d[:, None], out=out)  # int8 -> float32 exactly, one rounding
