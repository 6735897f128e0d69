"""Unquantized storage: F32, F16 and BF16, one value per "block", little-endian as in GGUF.

    F32   | b0 b1 b2 b3 |   IEEE binary32
    F16   | b0 b1 |         IEEE binary16
    BF16  | b0 b1 |         upper 16 bits of the binary32: sign, 8-bit exponent, 7-bit mantissa

Finite values too large for the target type become +-inf, exactly as in gguf-py
(F16 overflows at |x| >= 65520, BF16 at |x| >= 3.3961e38); only non-finite *input* is rejected.
"""

from __future__ import annotations

import numpy as np

from .base import BufferLike, Codec, ShapeLike, normalize_shape
from .errors import QuantError


class F32(Codec):
    name = "f32"
    ggml_type = 0
    block_size = 1
    type_size = 4

    def dequantize(self, data: BufferLike, shape: ShapeLike) -> np.ndarray:
        """Zero-copy: the result is a view of `data` (read-only if `data` is)."""
        dims = normalize_shape(shape)
        values = self._checked_bytes(data, dims).view("<f4")  # (prod(dims),)
        return values.astype(np.float32, copy=False).reshape(dims)

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        out.reshape(-1).view("<f4")[:] = x.reshape(-1)

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        out.reshape(-1)[:] = raw.view("<f4")


class F16(Codec):
    name = "f16"
    ggml_type = 1
    block_size = 1
    type_size = 2

    def quantize(self, x: np.ndarray) -> np.ndarray:
        # gguf-py casts straight to float16 (one rounding), not through float32 first: for
        # float64 input the two can differ in the last bit (double rounding), so do the same.
        arr = self._real_array(x)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise QuantError(self._non_finite_message(arr, arr))
        with np.errstate(over="ignore"):  # overflow to inf is gguf's behaviour, see top
            f16 = arr.astype("<f2", order="C")  # (..., n), always a fresh copy
        return f16.view(np.uint8)  # (..., 2n)

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:  # unused: see quantize
        out.reshape(-1).view("<f2")[:] = x.reshape(-1)

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        out.reshape(-1)[:] = raw.view("<f2")  # exact widening


class BF16(Codec):
    name = "bf16"
    ggml_type = 30
    block_size = 1
    type_size = 2

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        out.reshape(-1).view("<u2")[:] = bf16_bits(x.reshape(-1))

    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        # A bf16 is the top half of a float32: widen the 16 bits and shift them up in place.
        np.left_shift(raw.view("<u2"), np.uint32(16), out=out.reshape(-1).view(np.uint32))


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 (n,) -> uint16 (n,) bfloat16 bit patterns, like ggml_compute_fp32_to_bf16.

    Round to nearest, ties to even, on the bit pattern: add 0x7FFF plus the lowest kept bit,
    then drop the low 16 bits. The carry can ripple into the exponent, which is right (it
    rounds up to the next binade, or to inf past the largest bf16). NaN would not survive
    that addition (a NaN with only low mantissa bits would truncate to inf), so NaNs are
    first turned into quiet NaNs: top 16 bits kept, bf16 quiet bit 0x0040 set.
    Codec.quantize rejects NaN before we get here; the branch keeps this a faithful port.
    """
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)  # (n,)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    bits = np.where(is_nan, (bits & np.uint32(0xFFFF0000)) | np.uint32(0x00400000), bits)
    # Widened to uint64 like ggml's reference. With NaNs rewritten above the 32-bit sum could
    # not wrap anyway (the largest pattern left, -inf 0xFF800000, has room), but it costs little.
    rounded = (bits.astype(np.uint64) + (np.uint64(0x7FFF) + ((bits >> np.uint32(16)) & 1))) >> 16
    return rounded.astype(np.uint16)
