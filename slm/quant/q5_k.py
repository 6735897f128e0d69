"""Q5_K: a super-block of 256 values in 8 sub-blocks of 32, 5-bit codes (GGML type 13), 176 bytes.
Decode only (slm reads it from GGUF files; it never quantizes to it).

    byte:  0      2      4              16            48                        176
           +------+------+--------------+-------------+-------------------------+
           |  d   | dmin |  scales[12]  |   qh[32]    |         qs[128]         |
           +------+------+--------------+-------------+-------------------------+
    d, dmin, scales:  as Q4_K (f16 super-block scales; 6-bit sc[s], mn[s], kquants.py)
    qs:   the low 4 bits, laid out as Q4_K's codes
    qh:   bit s of byte l = bit 4 of the code of element 32s + l   (s = sub-block 0..7)

    x_i ~= (d * sc[s]) * q_i - (dmin * mn[s]),   s = i // 32,  q_i in 0..31
"""

from __future__ import annotations

import numpy as np

from .base import DecodeOnlyCodec
from .kquants import K_SCALE_SIZE, QK_K
from .q4_k import decode_with_mins

BLOCK = np.dtype(
    [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (K_SCALE_SIZE,)), ("qh", "u1", (QK_K // 8,)),
     ("qs", "u1", (QK_K // 2,))]
)
SUB_BLOCK_BITS = np.arange(8, dtype=np.uint8)[None, :, None]  # (1, 8, 1): bit s for sub-block s


class Q5_K(DecodeOnlyCodec):
    name = "q5_k"
    ggml_type = 13
    block_size = QK_K
    type_size = 176
    block_dtype = BLOCK
    scale_fields = ("d", "dmin")

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        k = block.shape[0]
        qs = block["qs"].reshape(k, 4, 1, 32)  # (k, group, 1, 32)
        q = np.empty((k, 4, 2, 32), dtype=np.uint8)
        np.bitwise_and(qs[:, :, 0], np.uint8(0x0F), out=q[:, :, 0])
        np.right_shift(qs[:, :, 0], np.uint8(4), out=q[:, :, 1])
        q = q.reshape(k, 8, 32)  # (k, sub-block, 32)
        high = (block["qh"][:, None, :] >> SUB_BLOCK_BITS) & np.uint8(1)  # (k, 8, 32)
        q |= high << np.uint8(4)
        decode_with_mins(block, q.astype(np.float32), out)
