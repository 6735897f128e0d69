"""Scalar arithmetic shared by the GGML block quantizers, matched to gguf-py/ggml bit for bit.

The GGML reference quantizers all follow one recipe in float32:

    d  = <block statistic> / <constant>        # float32 division, later stored as float16
    id = 1/d, or 0 when d == 0                 # so an all-zero block encodes to zeros
    q  = round(x * id [+ offset])              # float32 products, then an integer cast

Two details decide bit-exactness and are easy to get wrong:
  * the scale is divided (not multiplied by a reciprocal constant) and `id` is computed
    from the float32 `d`, before `d` is rounded to float16;
  * `id` can be +-inf: for a block whose largest magnitude is below ~3.7e-37 (Q8_0) the
    float32 `d` is so small that 1/d overflows. Then x * id is +-inf, or NaN for x == 0,
    and C/NumPy casting of such values to an integer is undefined. On x86 (and what
    gguf-py produces there) every one of them becomes code 0; we make that explicit with
    `codes_from_float` so our output does not depend on the platform's cast.
"""

from __future__ import annotations

import numpy as np


def reciprocal_or_zero(d: np.ndarray) -> np.ndarray:
    """1/d elementwise in float32, 0 where d == 0 (also -0.0). May contain inf (see above)."""
    inv = np.zeros_like(d)  # (k,) float32
    np.divide(np.float32(1), d, out=inv, where=d != 0)  # 1/subnormal may overflow to inf
    return inv


def round_half_away_from_zero(v: np.ndarray) -> np.ndarray:
    """C's roundf: halves go away from zero (np.round/np.rint would go to even).

    floor(|v|) + (frac >= 0.5) is exact: the fractional part of a float32 is exactly
    representable, unlike `floor(|v| + 0.5)`, which rounds 0.49999997 up to 1.
    """
    a = np.abs(v)
    whole = np.floor(a)
    whole += (a - whole) >= np.float32(0.5)
    return np.copysign(whole, v)


def codes_from_float(q: np.ndarray, lo: int, hi: int, dtype: type[np.integer]) -> np.ndarray:
    """Integer codes from already-rounded floats: non-finite -> 0, then clip to [lo, hi].

    For finite blocks with a finite 1/d the values are always within range, except in Q4_0:
    an element of the same magnitude as the peak but opposite sign lands on 16 -> 15.
    """
    q = np.where(np.isfinite(q), q, np.float32(0))
    np.clip(q, lo, hi, out=q)
    return q.astype(dtype)


# 1.5 * 2**23: adding it to |v| < 2**22 leaves round-half-even(v) in the low mantissa bits.
_MAGIC = np.float32(12582912.0)


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int (k-quants), float32 -> int32, bit for bit.

    ggml adds 1.5 * 2**23 and reads the low 23 bits of the float32 sum: round half to even
    for |v| < 2**22. Out of that range (inf, NaN, huge values from a degenerate block) it
    returns whatever those bits say; release builds skip the range assert, so we reproduce
    the bits rather than np.rint (NaN gives 0, +-inf gives -4194304, never an error).
    """
    bits = (np.asarray(v, dtype=np.float32) + _MAGIC).view(np.int32)
    return (bits & np.int32(0x007FFFFF)) - np.int32(0x00400000)
