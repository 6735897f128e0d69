"""Quantized tensors as read-only views over memory-mapped blobs.

No tensor is ever dequantized whole here: kernels dequantize bounded row chunks on demand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from slm import quant
from slm.errors import IntegrityError


@dataclass(frozen=True)
class QuantTensor:
    name: str
    shape: tuple[int, ...]  # NumPy order; a linear weight is (out_features, in_features)
    codec: quant.Codec
    data: np.ndarray  # uint8 (rows, bytes_per_row), read-only, usually an mmap view

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[-1]

    def dequantize_rows(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, stop) as float32 (stop-start, cols), into `out` if given."""
        chunk = self.data[start:stop]
        shape = (stop - start, self.cols)
        if out is None:
            return self.codec.dequantize(chunk, shape)
        return self.codec.dequantize_into(chunk, shape, out)

    def take_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` as float32 (len(ids), cols): the embedding lookup."""
        return self.codec.dequantize(self.data[ids], (len(ids), self.cols))

    def dequantize(self) -> np.ndarray:
        """The whole tensor as float32 (tests and the verify oracle only)."""
        return self.codec.dequantize(self.data, self.shape)


def quant_tensor(name: str, shape, dtype: str, raw: memoryview | bytes) -> QuantTensor:
    codec = quant.get_codec(dtype)
    shape = tuple(shape)
    rows = shape[0] if len(shape) == 2 else 1
    data = np.frombuffer(raw, dtype=np.uint8)
    if data.size != codec.nbytes(shape):
        raise IntegrityError(f"tensor {name}: its blob has {data.size} bytes, its manifest's "
                             f"{dtype}{list(shape)} needs {codec.nbytes(shape)} (run `slm fsck`)")
    return QuantTensor(name, shape, codec, data.reshape(rows, -1))


def load_tensors(records, open_blob: Callable[[str], memoryview]) -> dict[str, QuantTensor]:
    """records: objects with name, shape, dtype, digest (the base manifest's tensor table)."""
    return {r.name: quant_tensor(r.name, r.shape, r.dtype, open_blob(r.digest)) for r in records}
