"""A minimal GGUF v3 writer: string / uint32 / float32 metadata and F32 tensors (what a LoRA
adapter file needs). The layout is the one slm.formats.gguf reads:

    "GGUF" | u32 3 | u64 n_tensors | u64 n_kv | kv... | tensor infos... | pad to 32 | data
    tensor info: string name | u32 n_dims | u64 ne[n_dims] (innermost first) | u32 type | u64 offset
"""

from __future__ import annotations

import struct
import numpy as np

from slm.formats.gguf import DEFAULT_ALIGNMENT, MAGIC
from slm.quant.ggml_types import GGMLType

_UINT32, _FLOAT32, _STRING = 4, 6, 8


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _value(value) -> bytes:
    if isinstance(value, str):
        return struct.pack("<I", _STRING) + _string(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"unsupported GGUF metadata value {value!r}")
    if isinstance(value, int):
        return struct.pack("<II", _UINT32, value)
    return struct.pack("<If", _FLOAT32, value)


def _pad(n: int) -> int:
    return -n % DEFAULT_ALIGNMENT


def write_gguf(out, metadata: dict, tensors: list[tuple[str, np.ndarray]]) -> int:
    """Write `tensors` (name, float32 array in NumPy order) with `metadata` to `out` (anything
    with write(bytes): slm.store.outputs.OutputFile); returns the size."""
    head = bytearray(MAGIC + struct.pack("<IQQ", 3, len(tensors), len(metadata)))
    for key, value in metadata.items():
        head += _string(key) + _value(value)
    offset = 0
    blobs = []
    for name, arr in tensors:
        data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        ne = tuple(reversed(arr.shape))  # innermost first
        head += _string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", int(GGMLType.F32), offset)
        blobs.append(data)
        offset += len(data) + _pad(len(data))
    head += b"\0" * _pad(len(head))
    size = out.write(bytes(head))
    for data in blobs:
        size += out.write(data) + out.write(b"\0" * _pad(len(data)))
    return size
