"""Q6_K: a super-block of 256 values in 16 sub-blocks of 16, 6-bit codes (GGML type 14), 210 bytes.

    byte:  0                    128               192             208    210
           +--------------------+-----------------+---------------+------+
           |      ql[128]       |     qh[64]      |  scales[16]   |  d   |
           +--------------------+-----------------+---------------+------+
    d:       f16 super-block scale;  scales: int8 sub-block scales sc[s], s = i // 16
    Two halves h = 0, 1 of 128 values each use ql[64h .. 64h+63] and qh[32h .. 32h+31];
    inside a half, value 32j + l (j = 0..3, l = 0..31) has its code q split as
        low 4 bits:  ql[64h + l]      low nibble (j=0), ql[64h + 32 + l] low nibble (j=1),
                     ql[64h + l]     high nibble (j=2), ql[64h + 32 + l] high nibble (j=3)
        high 2 bits: bits 2j+1..2j of qh[32h + l]

    x_i ~= (d * sc[s]) * (q_i - 32),   q_i in 0..63

Quantizing follows ggml's quantize_row_q6_K_ref: make_qx_quants (signed scale, weights x^2)
per sub-block, the scales quantized to int8 against the largest |scale| (-128 / it), and
the codes recomputed from the stored f16 d and int8 scales.
"""

from __future__ import annotations

import numpy as np

from .base import Codec
from .kquants import GROUP_MAX_EPS, QK_K, clamped_codes, make_qx_quants
from .rounding import nearest_int

BLOCK = np.dtype(
    [("ql", "u1", (QK_K // 2,)), ("qh", "u1", (QK_K // 4,)), ("scales", "i1", (QK_K // 16,)),
     ("d", "<f2")]
)
f32 = np.float32
PAIR_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]  # (1, 1, 4, 1)


class Q6_K(Codec):
    name = "q6_k"
    ggml_type = 14
    block_size = QK_K
    type_size = 210
    block_dtype = BLOCK
    scale_fields = ("d",)

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        k = x.shape[0]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # C's IEEE results
            sub = np.ascontiguousarray(x.reshape(k * 16, 16).T)  # (16, 16k) column/sub-block
            scales, levels = make_qx_quants(sub, 32)  # (16k,), (16, 16k)
            scales, levels = scales.reshape(k, 16), levels.T.reshape(k, 16, 16)
            # The sub-block scale of largest magnitude, the first on ties (C: strict `>`).
            magnitude = np.abs(scales)
            magnitude = np.where(magnitude > 0, magnitude, f32(0))  # NaN never wins
            first = magnitude.argmax(axis=1)  # (k,)
            max_abs = magnitude[np.arange(k), first]  # (k,)
            max_scale = scales[np.arange(k), first]  # (k,) signed
            iscale = f32(-128) / max_scale  # (k,)
            d = (f32(1) / iscale).astype(np.float16)  # (k,)
            # C: scales[ib] = MIN(127, nearest_int(...)) stored in an int8 (wraps).
            sc = np.minimum(nearest_int(iscale[:, None] * scales), 127).astype(np.int8)  # (k, 16)
            dd = d.astype(f32)[:, None] * sc.astype(f32)  # (k, 16)
            fresh = clamped_codes(x.reshape(k, 16, 16) / dd[..., None], -32, 31) + f32(32)
            levels = np.where((dd != 0)[..., None], fresh, levels)  # (k, 16, 16)
        q = levels.astype(np.uint8).reshape(k, 2, 4, 32)  # (k, half, j, l)
        block = out.reshape(-1).view(BLOCK)  # (k,)
        low = q & np.uint8(0x0F)
        block["ql"] = (low[:, :, 0:2] | (low[:, :, 2:4] << np.uint8(4))).reshape(k, 128)
        block["qh"] = np.bitwise_or.reduce((q >> np.uint8(4)) << PAIR_SHIFTS, axis=2).reshape(k, 64)
        block["scales"] = sc
        block["d"] = d
        # A super-block whose scales are all (near) zero is stored as zero bytes.
        out[max_abs < GROUP_MAX_EPS] = 0

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        k = block.shape[0]
        ql = block["ql"].reshape(k, 2, 2, 32)  # (k, half, ql[0:32] / ql[32:64], 32)
        q = np.empty((k, 2, 4, 32), dtype=np.uint8)  # (k, half, j, l)
        np.bitwise_and(ql, np.uint8(0x0F), out=q[:, :, 0:2])
        np.right_shift(ql, np.uint8(4), out=q[:, :, 2:4])
        high = (block["qh"].reshape(k, 2, 1, 32) >> PAIR_SHIFTS) & np.uint8(3)  # (k, 2, 4, 32)
        q |= high << np.uint8(4)
        codes = q.astype(np.int8) - np.int8(32)  # (k, 2, 4, 32) in -32..31
        scale = block["d"].astype(f32)[:, None] * block["scales"].astype(f32)  # (k, 16)
        view = out.reshape(k, 16, 16)
        np.multiply(codes.reshape(k, 16, 16), scale[..., None], out=view)
