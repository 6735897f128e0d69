"""Safetensors reader, strict about headers that lie.

    file: u64 header_len (LE) | header JSON (header_len bytes) | data
    header: {"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, ...,
             "__metadata__": {str: str}}    offsets are relative to the start of data

Why our own reader and not safetensors.safe_open: NumPy has no bfloat16 (most HF checkpoints
are BF16), and we want every violation (offsets past the end, overlaps, a size that does not
match dtype x shape) as a one-line error naming the tensor. Writing uses the safetensors package.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slm.errors import InvalidInput, NotFound
from slm.formats.jsonfile import parse_json
from slm.formats.untrusted import open_binary

MAX_HEADER = 100 << 20  # the format's own limit is 100 MB

# dtype name -> (numpy dtype used to view the bytes, item size)
DTYPES = {
    "F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2),
    "I64": ("<i8", 8), "I32": ("<i4", 4), "I16": ("<i2", 2), "I8": ("<i1", 1),
    "U8": ("<u1", 1), "U16": ("<u2", 2), "U32": ("<u4", 4), "U64": ("<u8", 8), "BOOL": ("<u1", 1),
}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offsets
    end: int


class SafetensorsFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            with open_binary(self.path) as f:
                self.size = f.seek(0, 2)
                if self.size < 8:
                    raise InvalidInput(f"{self.path.name}: not a safetensors file (too short)")
                self._map = mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_READ)
        except FileNotFoundError as err:
            raise NotFound(f"no such file: {self.path}") from err
        except OSError as err:
            raise InvalidInput(f"cannot read {self.path}: {err.strerror}") from err
        self.metadata, self.tensors = self._parse()

    def _fail(self, what: str) -> InvalidInput:
        return InvalidInput(f"{self.path.name}: malformed safetensors: {what}")

    def _parse(self) -> tuple[dict, dict[str, TensorEntry]]:
        (header_len,) = struct.unpack_from("<Q", self._map, 0)
        if header_len > MAX_HEADER or 8 + header_len > self.size:
            raise self._fail(f"header length {header_len} exceeds the file or the 100 MB limit")
        try:
            header = parse_json(bytes(self._map[8:8 + header_len]).decode("utf-8"))
        except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise self._fail(f"header is not JSON ({err})") from err
        if not isinstance(header, dict):
            raise self._fail("header is not a JSON object")
        data_start = 8 + header_len
        data_len = self.size - data_start
        metadata = header.pop("__metadata__", {}) or {}
        if not isinstance(metadata, dict):
            raise self._fail("__metadata__ is not an object")
        tensors: dict[str, TensorEntry] = {}
        for name, spec in header.items():
            tensors[name] = self._entry(name, spec, data_start, data_len)
        spans = sorted((t.begin, t.end, t.name) for t in tensors.values())
        for (b0, e0, n0), (b1, _, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise self._fail(f"tensors {n0} and {n1} overlap")
        return metadata, tensors

    def _entry(self, name: str, spec, data_start: int, data_len: int) -> TensorEntry:
        if not isinstance(spec, dict):
            raise self._fail(f"entry {name} is not an object")
        dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise self._fail(f"tensor {name} has unsupported dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise self._fail(f"tensor {name} has an invalid shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) for o in offsets)):
            raise self._fail(f"tensor {name} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        if not 0 <= begin <= end <= data_len:
            raise self._fail(
                f"tensor {name} data_offsets [{begin}, {end}] lie outside the data ({data_len} bytes)"
            )
        expected = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype][1]
        if end - begin != expected:
            raise self._fail(
                f"tensor {name} spans {end - begin} bytes but {dtype}{shape} needs {expected}"
            )
        return TensorEntry(name, dtype, tuple(shape), data_start + begin, data_start + end)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored values, viewed without copying (BF16 as uint16)."""
        t = self.tensors[name]
        np_dtype = np.dtype(DTYPES[t.dtype][0])
        count = (t.end - t.begin) // np_dtype.itemsize
        return np.frombuffer(self._map, dtype=np_dtype, count=count, offset=t.begin).reshape(t.shape)

    def float32(self, name: str) -> np.ndarray:
        """The tensor as float32 (BF16 widened exactly; F16/F64 converted)."""
        t = self.tensors[name]
        arr = self.raw(name)
        if t.dtype == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        if t.dtype not in ("F32", "F16", "F64"):
            raise InvalidInput(f"{self.path.name}: tensor {name} is {t.dtype}, not a float tensor")
        return arr.astype(np.float32)

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:
            pass

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
