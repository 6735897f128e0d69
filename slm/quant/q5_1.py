"""Q5_1: 32 values as 5-bit steps above the block minimum (GGML type 7), 24 bytes.

    byte:   0     1     2     3     4  ..  7     8                  23
          +-----+-----+-----+-----+-----------+-----+ ... +-----+
          |  d (f16)  |  m (f16)  | qh (u32)  | b0  |     | b15 |
          +-----+-----+-----+-----+-----------+-----+ ... +-----+
    qh:   bit i = bit 4 of q[i]           (little-endian, as in Q5_0)
    b_j:  | q[j+16] & 15 | q[j] & 15 |    (halves as in Q4_1)

    x_i ~= d * q_i + m,   m = min(x),  d = (max(x) - min(x)) / 31,  q_i in 0..31

Q4_1's recipe with one more bit; codes against the float32 min, decoding with the f16 m.
"""

from __future__ import annotations

import numpy as np

from .base import Codec
from .nibbles import pack_halves
from .q5_0 import five_bit_codes, pack_fifth_bits
from .rounding import codes_from_float, reciprocal_or_zero

BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))])


class Q5_1(Codec):
    name = "q5_1"
    ggml_type = 7
    block_size = 32
    type_size = 24
    block_dtype = BLOCK
    scale_fields = ("d", "m")

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        lo = x.min(axis=1)  # (k,)
        hi = x.max(axis=1)  # (k,)
        d = (hi - lo) / np.float32(31)  # (k,) float32; may overflow to inf: id = 0
        inv_d = reciprocal_or_zero(d)  # (k,)
        steps = np.trunc((x - lo[:, None]) * inv_d[:, None] + np.float32(0.5))  # (k, 32)
        q = codes_from_float(steps, 0, 31, np.uint8)  # (k, 32)
        block = out.reshape(-1).view(BLOCK)  # (k,)
        block["d"] = d
        block["m"] = lo
        block["qh"] = pack_fifth_bits(q)  # (k, 4)
        block["qs"] = pack_halves(q & np.uint8(0x0F))  # (k, 16)

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        d = block["d"].astype(np.float32)[:, None]  # (k, 1)
        m = block["m"].astype(np.float32)[:, None]  # (k, 1)
        codes = five_bit_codes(block["qh"], block["qs"])  # (k, 32)
        # d * q first, then + m: two float32 roundings, as gguf-py and ggml (no FMA).
        np.multiply(codes, d, out=out)
        np.add(out, m, out=out)
