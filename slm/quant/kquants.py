"""What the k-quants (Q2_K .. Q6_K) share: super-blocks of 256, the 6-bit scale packing of
Q4_K/Q5_K, and NumPy ports of ggml's scale searches (ggml-quants.c: make_qkx2_quants,
make_qx_quants) that decide the codes.

The ports are vectorised over sub-blocks, position-major: every array is (n, m), one column
per sub-block of n values, so C's running sums become n contiguous vector adds. ggml runs
each search as a loop per sub-block; its steps depend on each other (a better candidate moves
the minimum the next step starts from), so we loop over the *steps* (and the n positions of a
sum) in Python and over the sub-blocks in NumPy, never over blocks.

Bit-exactness with ggml's C needs its float32 operation order, without FMA (ggml-base is
built for baseline x86-64, where the compiler cannot fuse):
  * sums run left to right from 0 (`sequential_sum`), never pairwise as np.sum does;
  * a * b * c is (a * b) * c, and the int codes are converted to float32 before multiplying;
  * rounding is ggml's nearest_int (rounding.py), reproduced on the bits.
"""

from __future__ import annotations

import numpy as np

from .rounding import nearest_int

QK_K = 256  # values per super-block
K_SCALE_SIZE = 12  # bytes of packed 6-bit scales and mins in Q4_K / Q5_K
GROUP_MAX_EPS = np.float32(1e-15)  # ggml: a sub-block with max|x| below this is all zero


def sequential_sum(terms: np.ndarray, first: np.ndarray | None = None) -> np.ndarray:
    """(n, m) float32 -> (m,): C's `float s = 0; for (i) s += t[i];`, rounding for rounding.

    Position-major: one row per position, so each += is one contiguous NumPy add over all
    sub-blocks (np.sum would add pairwise, and rounds differently). `first` replaces the
    leading 0 when C starts from a value (`float s = t[0]; for (i = 1 ..)`).
    """
    total = np.zeros(terms.shape[1], dtype=np.float32) if first is None else first.copy()
    for row in terms if first is None else terms[1:]:
        total += row
    return total


def clamped_codes(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """nearest_int(v) clamped to [lo, hi], as float32 (the searches multiply with it)."""
    return np.clip(nearest_int(v), lo, hi).astype(np.float32)


def weighted_sq_error(
    x: np.ndarray, w: np.ndarray, levels: np.ndarray, scale: np.ndarray, low: np.ndarray
) -> np.ndarray:
    """sum_i w_i * (scale * l_i + low - x_i)^2 per sub-block, in ggml's order.

    x, w, levels: (n, m); scale, low: (m,) -> (m,)."""
    diff = scale * levels  # (n, m)
    diff += low
    diff -= x
    diff *= diff
    diff *= w
    return sequential_sum(diff)


def make_qkx2_quants(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's make_qkx2_quants (squared error): x ~= scale * L - the_min, L in 0..nmax.

    x, w: (n, m) float32 values and weights, one column per sub-block (position-major)
    -> scale (m,), the_min (m,), L (n, m) float32.
    The minimum is clamped to <= 0; then nstep + 1 candidate scales
    (rmin + rdelta * step + nmax) / (max - min) each get a weighted least-squares fit of
    (scale, min), kept when its weighted error is strictly smaller.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # C's IEEE results
        return _make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep)


def _make_qkx2_quants(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    f32 = np.float32
    low = np.minimum(x.min(axis=0), f32(0))  # (m,) C: if (min > 0) min = 0
    high = x.max(axis=0)  # (m,)
    flat = high == low  # (m,) -> all codes 0, scale 0
    sum_w = sequential_sum(w, first=w[0])  # (m,) C starts from w[0], not 0 + w[0]
    wx = w * x  # (n, m)
    sum_x = sequential_sum(wx, first=wx[0])
    iscale = f32(nmax) / (high - low)  # (m,)
    scale = f32(1) / iscale  # (m,)
    levels = clamped_codes(iscale * (x - low), 0, nmax)  # (n, m)
    best = weighted_sq_error(x, w, levels, scale, low)  # (m,)
    for step in range(nstep + 1):
        factor = f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)  # float32 like C
        iscale = factor / (high - low)  # (m,) `low` is the best fit so far
        trial = clamped_codes(iscale * (x - low), 0, nmax)  # (n, m)
        wl = w * trial  # (n, m)
        sum_l = sequential_sum(wl)
        sum_l2 = sequential_sum(wl * trial)
        sum_xl = sequential_sum(wl * x)
        det = sum_w * sum_l2 - sum_l * sum_l  # (m,)
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = this_min > 0  # then fit the scale alone, with min 0
        this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
        this_min = np.where(positive, f32(0), this_min)
        error = weighted_sq_error(x, w, trial, this_scale, this_min)
        better = (det > 0) & (error < best) & ~flat  # (m,) NaN compares false, as in C
        np.copyto(levels, trial, where=better)
        best = np.where(better, error, best)
        scale = np.where(better, this_scale, scale)
        low = np.where(better, this_min, low)
    scale = np.where(flat, f32(0), scale)
    np.copyto(levels, f32(0), where=flat)
    return scale, -low, levels


def make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_qx_quants with rmse_type 1 and no importance weights (as Q6_K's _ref uses
    it): x ~= scale * (L - nmax), L in 0..2*nmax-1, weights x^2.

    x: (n, m) float32, one column per sub-block -> scale (m,), L (n, m) float32. The scale
    is signed: it starts at -nmax / peak (peak = first element of largest |x|, with its
    sign), then 18 neighbouring scales -(nmax + 0.1 * is) / peak, is = -9..9, replace it
    when sumlx^2 / suml2 improves.
    """
    f32 = np.float32
    m = x.shape[1]
    ax = np.abs(x)
    first = ax.argmax(axis=0)  # (m,) the FIRST largest |x|, as C's strict `>`
    peak = x[first, np.arange(m)]  # (m,) signed
    zero = ax[first, np.arange(m)] < GROUP_MAX_EPS  # (m,) all (near) zero: codes 0, scale 0
    w = x * x  # (n, m)
    wx = w * x  # (n, m) C: w * x[i] * l = (w * x[i]) * l

    def attempt(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        signed = clamped_codes(iscale * x, -nmax, nmax - 1)  # (n, m)
        return signed, sequential_sum(wx * signed), sequential_sum(w * signed * signed)

    # all-zero sub-blocks divide by 0 (masked at the end); huge values overflow as in C
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        signed, sumlx, suml2 = attempt(f32(-nmax) / peak)
        scale = np.where(suml2 != 0, sumlx / suml2, f32(0))  # C: suml2 ? sumlx/suml2 : 0
        best = scale * sumlx
        for step in (*range(-9, 0), *range(1, 10)):
            trial, t_sumlx, t_suml2 = attempt(-(f32(nmax) + f32(0.1) * f32(step)) / peak)
            better = (t_suml2 > 0) & (t_sumlx * t_sumlx > best * t_suml2)  # (m,)
            np.copyto(signed, trial, where=better)
            scale = np.where(better, t_sumlx / t_suml2, scale)
            best = np.where(better, scale * t_sumlx, best)
    levels = signed + f32(nmax)  # (n, m) 0..2*nmax-1
    np.copyto(levels, f32(0), where=zero)
    return np.where(zero, f32(0), scale), levels


# ------------------------------------------------------------- Q4_K / Q5_K scale packing
#
# Eight 6-bit scales sc[0..7] and eight 6-bit mins mn[0..7] in 12 bytes:
#
#    byte 0..3:   | sc[j+4] >> 4 (2 bits) | sc[j] (6 bits) |        j = 0..3
#    byte 4..7:   | mn[j+4] >> 4 (2 bits) | mn[j] (6 bits) |
#    byte 8..11:  | mn[j+4] & 15 (4 bits) | sc[j+4] & 15 (4 bits) |


def pack_scales_mins(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """(k, 8) uint8 scales and mins < 64 -> (k, 12) packed bytes (layout above)."""
    out = np.empty((sc.shape[0], K_SCALE_SIZE), dtype=np.uint8)
    lo, hi = slice(0, 4), slice(4, 8)
    out[:, 0:4] = sc[:, lo] | ((sc[:, hi] >> np.uint8(4)) << np.uint8(6))
    out[:, 4:8] = mn[:, lo] | ((mn[:, hi] >> np.uint8(4)) << np.uint8(6))
    out[:, 8:12] = (sc[:, hi] & np.uint8(0x0F)) | ((mn[:, hi] & np.uint8(0x0F)) << np.uint8(4))
    return out


def unpack_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, 12) packed bytes -> (k, 8) scales, (k, 8) mins, uint8 (ggml's get_scale_min_k4)."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]  # (k, 4) each
    low6, low4, s4, s6 = np.uint8(0x3F), np.uint8(0x0F), np.uint8(4), np.uint8(6)
    sc = np.concatenate([a & low6, (c & low4) | ((a >> s6) << s4)], axis=1)  # (k, 8)
    mn = np.concatenate([b & low6, (c >> s4) | ((b >> s6) << s4)], axis=1)  # (k, 8)
    return sc, mn
