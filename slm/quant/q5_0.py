"""Q5_0: 32 values as 5-bit codes around 16, one float16 scale (GGML type 6), 22 bytes.

    byte:   0     1     2     3     4     5     6                  21
          +-----+-----+-----+-----+-----+-----+-----+ ... +-----+
          |  d (f16)  |  qh (u32, little-endian)  | b0  |     | b15 |
          +-----+-----+-----+-----+-----+-----+-----+ ... +-----+
    qh:   bit i = bit 4 of q[i], i = 0..31
    b_j:  | 7 6 5 4 | 3 2 1 0 |
          | q[j+16] |  q[j]   |      (low 4 bits of each code, halves as in Q4_0)

    x_i ~= d * (q_i - 16),   q_i in 0..31

Q4_0's recipe with one more bit: d = m / -16 for the signed peak m (first on ties).
"""

from __future__ import annotations

import numpy as np

from .base import Codec
from .nibbles import pack_halves, unpack_halves
from .rounding import codes_from_float, reciprocal_or_zero

BLOCK = np.dtype([("d", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))])


def pack_fifth_bits(q: np.ndarray) -> np.ndarray:
    """(k, 32) codes < 32 -> (k, 4) bytes: bit i of the little-endian u32 is bit 4 of q[i]."""
    return np.packbits(q >> np.uint8(4), axis=1, bitorder="little")


def five_bit_codes(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """(k, 4) qh and (k, 16) qs bytes -> (k, 32) uint8 codes 0..31 in element order."""
    k = qs.shape[0]
    codes = np.empty((k, 2, 16), dtype=np.uint8)
    unpack_halves(qs, codes)  # (k, 2, 16): low 4 bits, first half then second half
    codes = codes.reshape(k, 32)
    codes |= np.unpackbits(qh, axis=1, bitorder="little") << np.uint8(4)  # (k, 32)
    return codes


class Q5_0(Codec):
    name = "q5_0"
    ggml_type = 6
    block_size = 32
    type_size = 22
    block_dtype = BLOCK
    scale_fields = ("d",)

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        k = x.shape[0]
        first_peak = np.abs(x).argmax(axis=1)  # (k,) index of the first max |x|
        peak = x[np.arange(k), first_peak]  # (k,) signed
        d = peak / np.float32(-16)  # (k,) float32
        inv_d = reciprocal_or_zero(d)  # (k,)
        shifted = np.trunc(x * inv_d[:, None] + np.float32(16.5))  # (k, 32), as Q4_0 with 16
        q = codes_from_float(shifted, 0, 31, np.uint8)  # (k, 32)
        block = out.reshape(-1).view(BLOCK)  # (k,)
        block["d"] = d
        block["qh"] = pack_fifth_bits(q)  # (k, 4)
        block["qs"] = pack_halves(q & np.uint8(0x0F))  # (k, 16)

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        d = block["d"].astype(np.float32)  # (k,)
        codes = five_bit_codes(block["qh"], block["qs"])  # (k, 32)
        np.subtract(codes, np.float32(16), out=out)  # exact
        np.multiply(out, d[:, None], out=out)
