"""Q3_K: a super-block of 256 values in 16 sub-blocks of 16, 3-bit codes (GGML type 11),
110 bytes. Decode only (slm reads it from GGUF files; it never quantizes to it).

    byte:  0             32                        96             108    110
           +-------------+-------------------------+--------------+------+
           |  hmask[32]  |         qs[64]          |  scales[12]  |  d   |
           +-------------+-------------------------+--------------+------+
    d:       f16 super-block scale
    scales:  sixteen 6-bit values sc[s] (s = i // 16), stored with an offset of 32:
               low 4 bits:  s < 8: scales[s] & 15,  s >= 8: scales[s - 8] >> 4
               high 2 bits: bits 2(s//4)+1 .. 2(s//4) of scales[8 + s % 4]
    qs:      2 low bits of each code, laid out as Q2_K's codes
    hmask:   bit 4h + j of hmask[l] is the third bit of value 32j + l of half h;
             a CLEAR bit means the code is 4 lower

    x_i ~= (d * (sc[s] - 32)) * (q_i - (4 if the hmask bit is clear else 0)),   in -4..3
"""

from __future__ import annotations

import numpy as np

from .base import DecodeOnlyCodec
from .kquants import QK_K
from .q2_k import two_bit_codes

BLOCK = np.dtype(
    [("hmask", "u1", (QK_K // 8,)), ("qs", "u1", (QK_K // 4,)), ("scales", "u1", (12,)),
     ("d", "<f2")]
)
HMASK_BITS = np.arange(8, dtype=np.uint8)[None, :, None]  # (1, 8, 1): bit 4h + j
NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)[None, :, None]  # (1, 2, 1)
PAIR_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)[None, :, None]  # (1, 4, 1)


def signed_scales(packed: np.ndarray) -> np.ndarray:
    """(k, 12) bytes -> (k, 16) float32 sub-block scales sc[s] - 32 (layout above)."""
    k = packed.shape[0]
    low = (packed[:, None, 0:8] >> NIBBLE_SHIFTS) & np.uint8(0x0F)  # (k, 2, 8) -> s = 8n + i
    high = (packed[:, None, 8:12] >> PAIR_SHIFTS) & np.uint8(0x03)  # (k, 4, 4) -> s = 4p + i
    six = low.reshape(k, 16) | (high.reshape(k, 16) << np.uint8(4))  # (k, 16) in 0..63
    return six.astype(np.float32) - np.float32(32)


class Q3_K(DecodeOnlyCodec):
    name = "q3_k"
    ggml_type = 11
    block_size = QK_K
    type_size = 110
    block_dtype = BLOCK
    scale_fields = ("d",)

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        k = block.shape[0]
        third = (block["hmask"][:, None, :] >> HMASK_BITS) & np.uint8(1)  # (k, 8, 32)
        lower = (third.reshape(k, 16, 16) ^ np.uint8(1)) << np.uint8(2)  # 4 where the bit is clear
        q = two_bit_codes(block["qs"]).astype(np.int8) - lower.astype(np.int8)  # (k, 16, 16) -4..3
        scale = block["d"].astype(np.float32)[:, None] * signed_scales(block["scales"])  # (k, 16)
        np.multiply(q, scale[..., None], out=out.reshape(k, 16, 16))
