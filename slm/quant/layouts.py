"""How many bytes a tensor of each storage type takes, without importing the codecs.

`slm activate` checks every tensor record of a base manifest against its dtype and shape, and
that check is all it needs of the codecs; importing them imports NumPy, which is most of an
activation's start-up. So the layouts (values per block, bytes per block) are also here, and
every codec is checked against this table when it registers (registry.register): the two
cannot drift apart.

    dtype   values/block  bytes/block        dtype  values/block  bytes/block
    f32          1             4             q2_k       256           84
    f16          1             2             q3_k       256          110
    bf16         1             2             q4_k       256          144
    q4_0        32            18             q5_k       256          176
    q4_1        32            20             q6_k       256          210
    q5_0        32            22             nf4         64           36
    q5_1        32            24
    q8_0        32            34
"""

from __future__ import annotations

import math

LAYOUTS: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
    "q2_k": (256, 84), "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210),
    "nf4": (64, 36),
}


def stored_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """The bytes of a `dtype` tensor of `shape` (positive ints), as its codec's nbytes says.
    A dtype this table lacks, or a shape the type cannot hold, goes to the codec itself, whose
    QuantError names the problem."""
    layout = LAYOUTS.get(dtype)
    if layout is None or not shape or shape[-1] % layout[0]:
        from slm.quant.registry import get_codec

        return get_codec(dtype).nbytes(shape)
    values, size = layout
    return math.prod(shape[:-1]) * (shape[-1] // values) * size
