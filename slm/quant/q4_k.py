"""Q4_K: a super-block of 256 values in 8 sub-blocks of 32, 4-bit codes (GGML type 12), 144 bytes.

    byte:  0      2      4              16                                    144
           +------+------+--------------+--------------------------------------+
           |  d   | dmin |  scales[12]  |               qs[128]                |
           +------+------+--------------+--------------------------------------+
    d, dmin:  f16 super-block scales for the sub-block scales and mins
    scales:   eight 6-bit scales sc[s] and eight 6-bit mins mn[s] (packing in kquants.py)
    qs:       4 groups of 32 bytes; byte l of group g holds two codes:
                  | 7 6 5 4      | 3 2 1 0   |
                  | q[64g+32+l]  | q[64g+l]  |

    x_i ~= (d * sc[s]) * q_i - (dmin * mn[s]),   s = i // 32,  q_i in 0..15

Quantizing follows ggml's quantize_row_q4_K_ref (the path ggml takes without an importance
matrix): per sub-block, make_qkx2_quants fits (scale, min) with weights av_x + |x|; the
scales and mins are quantized to 6 bits against the largest of each, and the codes are
recomputed from the f16/6-bit values actually stored.
"""

from __future__ import annotations

import numpy as np

from .base import Codec
from .kquants import (
    K_SCALE_SIZE,
    QK_K,
    clamped_codes,
    make_qkx2_quants,
    pack_scales_mins,
    sequential_sum,
    unpack_scales_mins,
)
from .rounding import nearest_int

BLOCK = np.dtype(
    [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (K_SCALE_SIZE,)), ("qs", "u1", (QK_K // 2,))]
)
f32 = np.float32


def six_bit_levels(values: np.ndarray, peak: np.ndarray) -> np.ndarray:
    """(k, 8) sub-block scales (or mins) -> 6-bit uint8 levels against the (k,) peak.

    C: uint8_t l = nearest_int(63/peak * v); l = MIN(63, l) -- the int -> uint8 store wraps.
    """
    inv = np.where(peak > 0, f32(63) / peak, f32(0))  # (k,)
    wrapped = nearest_int(inv[:, None] * values) & np.int32(0xFF)  # (k, 8)
    return np.minimum(wrapped, 63).astype(np.uint8)


def positive_max(values: np.ndarray) -> np.ndarray:
    """(k, 8) -> (k,): C's `float m = 0; if (v > m) m = v;` (NaN and negatives never win)."""
    return np.where(values > 0, values, f32(0)).max(axis=1)


def requantized_codes(
    x: np.ndarray, levels: np.ndarray, d: np.ndarray, dmin: np.ndarray, sc: np.ndarray,
    mn: np.ndarray, nmax: int,
) -> np.ndarray:
    """Codes recomputed from the stored f16 d, dmin and 6-bit sc, mn.

    x, levels: (k, 8, 32); d, dmin: (k,) f16; sc, mn: (k, 8). A sub-block whose effective
    scale is 0 keeps the search's codes (C: `if (!d) continue;`; NaN is not 0 there either).
    """
    dd = d.astype(f32)[:, None] * sc.astype(f32)  # (k, 8)
    dm = dmin.astype(f32)[:, None] * mn.astype(f32)  # (k, 8)
    fresh = clamped_codes((x + dm[..., None]) / dd[..., None], 0, nmax)  # (k, 8, 32)
    return np.where((dd != 0)[..., None], fresh, levels)


def fit_sub_blocks(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """ggml's per-sub-block fit of quantize_row_q4_K_ref (Q5_K's _ref differs only in its
    constants, nmax 31; slm does not write Q5_K).

    x: (k, 256) -> (sc, mn) (k, 8) uint8, (d, dmin) (k,) float16, codes (k, 8, 32) float32.
    """
    k = x.shape[0]
    sub = np.ascontiguousarray(x.reshape(k * 8, 32).T)  # (32, 8k) one column per sub-block
    av_x = np.sqrt(sequential_sum(sub * sub) / f32(32))  # (8k,)
    weights = av_x + np.abs(sub)  # (32, 8k)
    scales, mins, levels = make_qkx2_quants(sub, weights, nmax, rmin, rdelta, nstep)
    scales, mins = scales.reshape(k, 8), mins.reshape(k, 8)
    levels = levels.T.reshape(k, 8, 32)  # back to element order
    max_scale, max_min = positive_max(scales), positive_max(mins)  # (k,)
    sc, mn = six_bit_levels(scales, max_scale), six_bit_levels(mins, max_min)  # (k, 8)
    d = (max_scale / f32(63)).astype(np.float16)  # (k,)
    dmin = (max_min / f32(63)).astype(np.float16)
    codes = requantized_codes(x.reshape(k, 8, 32), levels, d, dmin, sc, mn, nmax)
    return sc, mn, d, dmin, codes


def decode_with_mins(block: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    """out (k, 256) = (d * sc) * q - dmin * mn per sub-block; q: (k, 8, 32) float32 codes."""
    k = q.shape[0]
    sc, mn = unpack_scales_mins(block["scales"])  # (k, 8) each
    scale = block["d"].astype(f32)[:, None] * sc.astype(f32)  # (k, 8)
    low = block["dmin"].astype(f32)[:, None] * mn.astype(f32)  # (k, 8)
    view = out.reshape(k, 8, 32)
    np.multiply(q, scale[..., None], out=view)  # two roundings, as gguf-py (no FMA)
    np.subtract(view, low[..., None], out=view)


class Q4_K(Codec):
    name = "q4_k"
    ggml_type = 12
    block_size = QK_K
    type_size = 144
    block_dtype = BLOCK
    scale_fields = ("d", "dmin")

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        k = x.shape[0]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # C's IEEE results
            sc, mn, d, dmin, codes = fit_sub_blocks(x, 15, -1.0, 0.1, 20)
        q = codes.astype(np.uint8).reshape(k, 4, 2, 32)  # (k, group, low/high, 32)
        block = out.reshape(-1).view(BLOCK)  # (k,)
        block["d"] = d
        block["dmin"] = dmin
        block["scales"] = pack_scales_mins(sc, mn)  # (k, 12)
        block["qs"] = (q[:, :, 0] | (q[:, :, 1] << np.uint8(4))).reshape(k, 128)

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        block = raw.view(BLOCK)  # (k,) zero-copy
        k = block.shape[0]
        qs = block["qs"].reshape(k, 4, 1, 32)  # (k, group, 1, 32)
        q = np.empty((k, 4, 2, 32), dtype=np.uint8)
        np.bitwise_and(qs[:, :, 0], np.uint8(0x0F), out=q[:, :, 0])  # sub-block 2g
        np.right_shift(qs[:, :, 0], np.uint8(4), out=q[:, :, 1])  # sub-block 2g + 1
        decode_with_mins(block, q.reshape(k, 8, 32).astype(f32), out)
