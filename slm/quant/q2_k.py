"""Q2_K: a super-block of 256 values in 16 sub-blocks of 16, 2-bit codes (GGML type 10), 84 bytes.
Decode only (slm reads it from GGUF files; it never quantizes to it).

    byte:  0               16                                80     82     84
           +---------------+---------------------------------+------+------+
           |  scales[16]   |             qs[64]              |  d   | dmin |
           +---------------+---------------------------------+------+------+
    scales[s]:  | mn[s] (4 bits) | sc[s] (4 bits) |     s = i // 16
    d, dmin:    f16 super-block scales for sc and mn
    Two halves h = 0, 1 of 128 values use qs[32h .. 32h+31]; value 32j + l of a half
    (j = 0..3, l = 0..31) is bits 2j+1..2j of qs[32h + l].

    x_i ~= (d * sc[s]) * q_i - (dmin * mn[s]),   q_i in 0..3
"""

from __future__ import annotations

import numpy as np

from .base import DecodeOnlyCodec
from .kquants import QK_K

BLOCK = np.dtype(
    [("scales", "u1", (QK_K // 16,)), ("qs", "u1", (QK_K // 4,)), ("d", "<f2"), ("dmin", "<f2")]
)
PAIR_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]  # (1, 1, 4, 1)


def two_bit_codes(qs: np.ndarray) -> np.ndarray:
    """(k, 64) bytes -> (k, 16, 16) uint8 codes 0..3 in element order (Q2_K and Q3_K)."""
    k = qs.shape[0]
    q = (qs.reshape(k, 2, 1, 32) >> PAIR_SHIFTS) & np.uint8(3)  # (k, half, j, l)
    return q.reshape(k, 16, 16)


class Q2_K(DecodeOnlyCodec):
    name = "q2_k"
    ggml_type = 10
    block_size = QK_K
    type_size = 84
    block_dtype = BLOCK
    scale_fields = ("d", "dmin")

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        k = block.shape[0]
        sc = block["scales"]  # (k, 16)
        scale = block["d"].astype(np.float32)[:, None] * (sc & np.uint8(0x0F)).astype(np.float32)
        low = block["dmin"].astype(np.float32)[:, None] * (sc >> np.uint8(4)).astype(np.float32)
        view = out.reshape(k, 16, 16)
        np.multiply(two_bit_codes(block["qs"]), scale[..., None], out=view)  # (k, 16, 16)
        np.subtract(view, low[..., None], out=view)  # two roundings, as gguf-py
