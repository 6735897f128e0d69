"""Q4_1: 32 values as 4-bit steps above the block minimum (GGML type 3), 20 bytes.

    byte:   0     1     2     3     4                  19
          +-----+-----+-----+-----+-----+-----+ ... +-----+
          |  d (f16)  |  m (f16)  | b0  | b1  |     | b15 |
          +-----+-----+-----+-----+-----+-----+ ... +-----+
    b_j:  | 7 6 5 4 | 3 2 1 0 |
          | q[j+16] |  q[j]   |      (first half of the block in the low nibbles)

    x_i ~= d * q_i + m,   m = min(x),  d = (max(x) - min(x)) / 15,  q_i in 0..15

Codes are computed against the float32 min, but decoding uses the float16-rounded m, so
even the minimum itself is generally not reproduced exactly.
"""

from __future__ import annotations

import numpy as np

from .base import Codec
from .nibbles import pack_halves, unpack_halves
from .rounding import codes_from_float, reciprocal_or_zero

BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])


class Q4_1(Codec):
    name = "q4_1"
    ggml_type = 3
    block_size = 32
    type_size = 20
    block_dtype = BLOCK
    scale_fields = ("d", "m")

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        lo = x.min(axis=1)  # (k,)
        hi = x.max(axis=1)  # (k,)
        d = (hi - lo) / np.float32(15)  # (k,) float32; hi - lo may overflow: d = inf, id = 0
        inv_d = reciprocal_or_zero(d)  # (k,)
        # trunc(v + 0.5) rounds half up; v >= 0 here. Three float32 roundings.
        # (inf * 0 or 0 * inf = NaN in the overflow cases: codes_from_float maps it to 0.)
        steps = np.trunc((x - lo[:, None]) * inv_d[:, None] + np.float32(0.5))  # (k, 32)
        q = codes_from_float(steps, 0, 15, np.uint8)  # (k, 32)
        block = out.reshape(-1).view(BLOCK)  # (k,)
        block["d"] = d
        block["m"] = lo
        block["qs"] = pack_halves(q)  # (k, 16)

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        k = block.shape[0]
        d = block["d"].astype(np.float32)[:, None, None]  # (k, 1, 1)
        m = block["m"].astype(np.float32)[:, None, None]  # (k, 1, 1)
        codes = np.empty((k, 2, 16), dtype=np.uint8)
        unpack_halves(block["qs"], codes)  # (k, 2, 16): [low nibbles, high nibbles]
        halves = out.reshape(k, 2, 16)  # view of out
        # d * q first, then + m: two separate float32 roundings, exactly as ggml (no FMA).
        np.multiply(codes, d, out=halves)
        np.add(halves, m, out=halves)
