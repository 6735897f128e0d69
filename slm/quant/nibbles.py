"""Packing of 4-bit codes into bytes, in the two orders our formats use.

GGML (Q4_0, Q4_1): a 32-value block is split in halves; byte j holds element j in its low
nibble and element j + 16 in its high nibble:

    byte j:  | 7 6 5 4 | 3 2 1 0 |
             |  q[j+16]|   q[j]  |

bitsandbytes (NF4): neighbours share a byte, the even element in the HIGH nibble:

    byte i:  | 7 6 5 4 | 3 2 1 0 |
             |  q[2i]  | q[2i+1] |
"""

from __future__ import annotations

import numpy as np


def pack_halves(codes: np.ndarray) -> np.ndarray:
    """(k, 2h) uint8 codes < 16 -> (k, h) bytes: first half low nibbles, second half high."""
    h = codes.shape[1] // 2
    return codes[:, :h] | (codes[:, h:] << np.uint8(4))


def unpack_halves(packed: np.ndarray, out: np.ndarray) -> None:
    """(k, h) bytes -> out (k, 2, h) uint8 codes: out[:, 0] low nibbles, out[:, 1] high."""
    np.bitwise_and(packed, np.uint8(0x0F), out=out[:, 0])
    np.right_shift(packed, np.uint8(4), out=out[:, 1])


def pack_pairs_high_first(codes: np.ndarray) -> np.ndarray:
    """(k, 2h) uint8 codes < 16 -> (k, h) bytes: element 2i high nibble, 2i+1 low nibble."""
    return (codes[:, 0::2] << np.uint8(4)) | codes[:, 1::2]
