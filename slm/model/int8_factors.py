"""The int8 mode's copies of a LoRA term's factors (qkernels/low_rank.c, slm_term.a8 and bt16).

A fused LoRA term is u = A x, then y += u B^T: two float32 factors that a decode step reads
cold from memory after the base's weights, as many bytes per token as a tenth of a 1B base's
quantized weights for r=16 on all seven projections. In the int8 mode (docs/numerics.md), whose
inputs are already int8 per 32 values, the kernels read instead A as Q8_0 rows (u[k] an int8
block product, as for any Q8_0 weight) and B^T as IEEE halves in tiles of 32 output rows (a
tile's ranks in one contiguous run): 38% of the float32 bytes. The
float32 mode (`--exact`) never reads them.

Built once per pair of factors, the first time a kernel descriptor of the int8 mode is made
for them (the float32 mode's descriptors point at the float32 factors alone, so a composition
run only with `--exact` holds no copies), kept while both arrays live, never written to the
store. Every descriptor of the same factors (the
op path's jobs, the batch's terms, the native step's) points at the same copies, so that a row
gets the same bits whichever path runs it.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from slm.quant import QuantError, get_codec

BT_TILE = 32  # output rows of a tile of B^T's halves (qkernels/low_rank.c's BT_TILE)
_COPIES: dict[tuple[int, int], tuple] = {}  # (id(A), id(B^T)) -> (A as Q8_0, B^T as halves) or (None, None)
_MAKING = threading.Lock()


def int8_factors(a: np.ndarray, b_t: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(A (r, in) as Q8_0 rows, uint8 (r, in / 32 * 34); B^T (r, out) as float16 in tiles of
    BT_TILE output rows, (ceil(out / BT_TILE), r, BT_TILE), zero-padded), or (None, None)
    when the int8 mode keeps the float32 factors for this term: A's width not a multiple of 32
    (no int8 input then), a value that is not finite (it passes through the float path as it
    is), or a value of B^T beyond a half's range."""
    key = (id(a), id(b_t))
    got = _COPIES.get(key)
    if got is not None:
        return got
    with _MAKING:
        got = _COPIES.get(key)
        if got is None:
            got = _make(a, b_t)
            _COPIES[key] = got
            for array in (a, b_t):  # gone with either array (its id may then name another)
                weakref.finalize(array, _COPIES.pop, key, None)
    return got


def copies_of(a: np.ndarray, b_t: np.ndarray) -> tuple | None:
    """The copies int8_factors made of these factors, or None when it has made none (nothing is
    built here)."""
    return _COPIES.get((id(a), id(b_t)))


def _make(a: np.ndarray, b_t: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    if a.ndim != 2 or a.shape[1] % 32 or not (np.isfinite(a).all() and np.isfinite(b_t).all()):
        return None, None
    with np.errstate(over="ignore"):
        halves = b_t.astype(np.float16)
    if not np.isfinite(halves).all():
        return None, None
    rank, out = b_t.shape
    padded = np.zeros((rank, -(-out // BT_TILE) * BT_TILE), dtype=np.float16)  # the last tile zero-padded
    padded[:, :out] = halves
    tiles = np.ascontiguousarray(padded.reshape(rank, -1, BT_TILE).transpose(1, 0, 2))
    try:
        rows = get_codec("q8_0").quantize(a)  # (r, in / 32 * 34)
    except QuantError:
        return None, None
    return rows, tiles


def untiled(tiles: np.ndarray, rows: int) -> np.ndarray:
    """B^T (rank, rows) from its tiles (int8_factors' second array)."""
    return tiles.transpose(1, 0, 2).reshape(tiles.shape[1], -1)[:, :rows]
