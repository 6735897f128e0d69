"""GGUF reader (versions 2 and 3), bounded against hostile input.

    file:  "GGUF" | u32 version | u64 n_tensors | u64 n_kv
           n_kv    x (string key | u32 value_type | value)
           n_tensors x (string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset)
           padding to `general.alignment` (default 32)
           tensor data; each tensor at data_start + offset
    string: u64 length | bytes (UTF-8)
    array:  u32 item_type | u64 count | items

All integers little-endian. dims are innermost-first (ne0 = row length), so a tensor's
NumPy shape is reversed(dims).

Every length and count is checked against the bytes that remain before anything is
allocated, so a lying header fails with a one-line InvalidInput, not a MemoryError.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from slm.errors import InvalidInput, NotFound
from slm.formats.untrusted import open_binary
from slm.quant.ggml_types import GGMLType

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 20
MAX_DIMS = 4
MAX_KEY_LEN = 1 << 16
# file times are coarse: a file changed less than this before it was opened may change again
# with the same ctime (slm.store.verified's rule, for the same reason)
RACY_NS = 100_000_000

# GGUF metadata value types: id -> (struct format, size) for scalars.
_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_NP_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
               7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # NumPy order (outermost first)
    ggml_type: int
    offset: int  # absolute offset in the file
    nbytes: int | None  # None when the type's size is unknown to the caller

    @property
    def type_name(self) -> str:
        """The GGML type's name from the one table (slm.quant.GGMLType), for messages."""
        try:
            return GGMLType(self.ggml_type).name
        except ValueError:
            return f"type#{self.ggml_type}"


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_start: int
    size: int
    _map: mmap.mmap | None
    fd: int = -1  # the file, open for reading while this is (an import copies ranges of it)
    opened: os.stat_result | None = None  # the file as it was when it was opened
    opened_at_ns: int = 0  # time.time_ns() then

    def tensor_bytes(self, info: TensorInfo) -> memoryview:
        self._check_readable(info)
        return memoryview(self._map)[info.offset:info.offset + info.nbytes]

    def _check_readable(self, info: TensorInfo) -> None:
        if info.nbytes is None:  # the reader's caller did not know this tensor type
            raise InvalidInput(f"{self.path.name}: tensor {info.name} has type {info.type_name}, "
                               "which slm does not read")
        if self._map is None:
            raise ValueError(f"{self.path.name} is closed (a bug: read after close)")

    def tensor_pieces(self, info: TensorInfo, piece_bytes: int) -> Iterator[memoryview]:
        """A tensor's bytes in views of at most `piece_bytes`, each one's pages let go of by this
        process once the next is asked for (madvise MADV_DONTNEED: the kernel's page cache keeps
        them, this process's resident memory does not), so that reading a whole file through
        here holds one piece at a time, not the file: an 8B base is 4.3 GB."""
        self._check_readable(info)
        mapped = self._map
        view = memoryview(mapped)
        for at in range(info.offset, info.offset + info.nbytes, piece_bytes):
            end = min(at + piece_bytes, info.offset + info.nbytes)
            piece = view[at:end]
            try:
                yield piece
            finally:
                try:
                    piece.release()
                except BufferError:
                    pass  # an error's traceback still holds an array over it: dropped with it
                _drop_pages(mapped, at, end)  # (a page read again later is simply read again)

    def unchanged_since_opened(self) -> bool | None:
        """Whether the file opened holds what it held then: False if it was written since (its
        size, mtime or ctime moved), True if not, None if its stamps cannot tell (it had changed
        less than RACY_NS before it was opened: a write in the same clock tick leaves the same
        ctime). A file renamed over its path meanwhile does not count: the one opened is read."""
        if self.opened is None or self.fd < 0:
            return False
        if _stamp(os.fstat(self.fd)) != _stamp(self.opened):
            return False
        return True if self.opened.st_ctime_ns < self.opened_at_ns - RACY_NS else None

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a caller still holds a view; the map closes when it is dropped
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stamp(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_PAGE = mmap.PAGESIZE


def _drop_pages(mapped: mmap.mmap, start: int, end: int) -> None:
    """Let go of this process's pages of [start, end) of a read-only file map (advisory: where
    madvise is missing or refuses, the pages stay until the map is closed)."""
    first = start - start % _PAGE
    try:
        mapped.madvise(mmap.MADV_DONTNEED, first, end - first)
    except (AttributeError, OSError, ValueError):
        pass


class _Cursor:
    def __init__(self, buf: memoryview, path: Path):
        self.buf = buf
        self.pos = 0
        self.path = path

    def fail(self, what: str) -> InvalidInput:
        return InvalidInput(f"{self.path.name}: malformed GGUF: {what} (at byte {self.pos})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"{what} runs past the end of the file (truncated?)")

    def scalar(self, fmt: str, size: int, what: str):
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.scalar("<I", 4, what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", 8, what)

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.u64(f"{what} length")
        if limit is not None and n > limit:
            raise self.fail(f"{what} length {n} exceeds the limit {limit}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            # Some vocabularies hold byte sequences that are not valid UTF-8 on their own.
            return raw.decode("utf-8", errors="surrogateescape")

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings, read as `string` reads each (same checks, same errors), in one loop:
        a vocabulary and its merges are ~100,000 strings, and a method call per string and per
        length was most of the time an import of SmolLM2 spent parsing its header."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(count):
            if pos + 8 > end:
                self.pos = pos
                raise self.fail(f"{what}[{i}] length runs past the end of the file (truncated?)")
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > end:
                self.pos = pos
                raise self.fail(f"{what}[{i}] runs past the end of the file (truncated?)")
            raw = buf[pos:pos + n]
            pos += n
            try:
                append(str(raw, "utf-8"))
            except UnicodeDecodeError:
                # Some vocabularies hold byte sequences that are not valid UTF-8 on their own.
                append(str(raw, "utf-8", "surrogateescape"))
        self.pos = pos
        return out

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            return self.scalar(fmt, size, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            item_type = self.u32(f"{what} item type")
            count = self.u64(f"{what} count")
            return self.array(item_type, count, what)
        raise self.fail(f"{what} has unknown value type {vtype}")

    def array(self, item_type: int, count: int, what: str) -> list | np.ndarray:
        remaining = len(self.buf) - self.pos
        min_item = _SCALARS[item_type][1] if item_type in _SCALARS else 8
        if count * min_item > remaining:
            raise self.fail(f"{what} claims {count} items, more than the file can hold")
        if item_type in _NP_SCALARS:
            dtype = np.dtype(_NP_SCALARS[item_type])
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += count * dtype.itemsize
            return arr.astype(bool) if item_type == 7 else arr
        if item_type == _STRING:
            return self.strings(count, what)
        if item_type == _ARRAY:
            out = []
            for i in range(count):
                sub_type = self.u32(f"{what}[{i}] item type")
                sub_count = self.u64(f"{what}[{i}] count")
                out.append(self.array(sub_type, sub_count, f"{what}[{i}]"))
            return out
        raise self.fail(f"{what} has unknown item type {item_type}")


def read_gguf(path: Path, tensor_nbytes=None) -> GGUFFile:
    """Parse a GGUF file's header and tensor table; tensor data stays memory-mapped.

    `tensor_nbytes(ggml_type, shape) -> int | None` gives the byte size of a tensor whose
    type the caller supports (None if unsupported); supported tensors are checked to lie
    inside the data section without overlapping.
    """
    path = Path(path)
    try:
        f = open_binary(path)
    except FileNotFoundError as err:
        raise NotFound(f"no such file: {path}") from err
    except OSError as err:
        raise InvalidInput(f"cannot read {path}: {err.strerror}") from err
    try:
        opened_at_ns = time.time_ns()
        opened = os.fstat(f.fileno())
        size = f.seek(0, 2)
        if size < 24:
            raise InvalidInput(f"{path.name}: not a GGUF file (only {size} bytes)")
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    except BaseException:
        f.close()
        raise
    view = memoryview(mapped)
    try:
        parsed = _parse(path, mapped, view, size, tensor_nbytes)
    except BaseException:
        view.release()
        f.close()
        try:
            mapped.close()
        except BufferError:
            pass  # an error's traceback still holds a view; the map closes when it is freed
        raise
    # the header's pages (a 128k-token vocabulary: megabytes) are parsed into Python objects
    _drop_pages(mapped, 0, parsed.data_start)
    parsed.fd, parsed.opened, parsed.opened_at_ns = os.dup(f.fileno()), opened, opened_at_ns
    f.close()
    return parsed


def _parse(path: Path, mapped: mmap.mmap, view: memoryview, size: int, tensor_nbytes) -> GGUFFile:
    cur = _Cursor(view, path)
    if bytes(cur.buf[:4]) != MAGIC:
        raise InvalidInput(f"{path.name}: not a GGUF file (bad magic)")
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise InvalidInput(f"{path.name}: GGUF version {version} is not supported (2 or 3)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise cur.fail(f"implausible counts ({n_tensors} tensors, {n_kv} metadata keys)")

    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}", limit=MAX_KEY_LEN)
        vtype = cur.u32(f"type of {key}")
        metadata[key] = cur.value(vtype, key)

    raw_tensors = []
    for i in range(n_tensors):
        name = cur.string(f"tensor name #{i}", limit=MAX_KEY_LEN)
        n_dims = cur.u32(f"{name} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {name} has {n_dims} dimensions")
        dims = [cur.u64(f"{name} dim") for _ in range(n_dims)]
        if any(d == 0 or d > 1 << 40 for d in dims):
            raise cur.fail(f"tensor {name} has an implausible shape {dims}")
        ggml_type = cur.u32(f"{name} type")
        offset = cur.u64(f"{name} offset")
        raw_tensors.append((name, tuple(reversed(dims)), ggml_type, offset))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-cur.pos // alignment) * alignment
    if data_start > size:
        raise cur.fail("tensor data section starts past the end of the file (truncated?)")

    tensors = []
    seen = set()
    for name, shape, ggml_type, offset in raw_tensors:
        if name in seen:
            raise InvalidInput(f"{path.name}: tensor {name} appears twice")
        seen.add(name)
        nbytes = tensor_nbytes(ggml_type, shape) if tensor_nbytes else None
        start = data_start + offset
        if offset % alignment:
            raise InvalidInput(f"{path.name}: tensor {name} offset {offset} is not aligned")
        if nbytes is not None and start + nbytes > size:
            raise InvalidInput(
                f"{path.name}: tensor {name} ({nbytes} bytes at {start}) runs past the end "
                f"of the file ({size} bytes); the file is truncated"
            )
        tensors.append(TensorInfo(name, shape, ggml_type, start, nbytes))
    _check_no_overlap(path, tensors)
    return GGUFFile(path, version, metadata, tensors, data_start, size, mapped)


def parse_gguf_header(header: bytes, size: int, name: str, tensor_nbytes=None) -> GGUFFile:
    """A GGUF file's header and tensor table from its first bytes (at least up to the tensor data:
    slm.formats.gguf_frame keeps them), checked as read_gguf checks a file of `size` bytes; the
    result holds no data (tensor_bytes refuses)."""
    return _parse(Path(name), None, memoryview(header), size, tensor_nbytes)


def _check_no_overlap(path: Path, tensors: list[TensorInfo]) -> None:
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors if t.nbytes)
    for (s0, e0, n0), (s1, _, n1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise InvalidInput(f"{path.name}: tensors {n0} and {n1} overlap")
