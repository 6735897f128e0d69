"""The Codec interface shared by every storage type (f32, f16, bf16, q8_0, q4_0, q4_1, nf4,
q5_0, q5_1 and the k-quants q2_k .. q6_k).

A codec turns a float tensor into bytes and back. Every type stores a tensor's last axis as
consecutive *blocks* of `block_size` values, each encoded in `type_size` bytes, so a tensor of
shape (..., n) occupies (..., n // block_size * type_size) bytes, row-major like GGUF.

Subclasses implement two block-level primitives and get validation, chunking and the public
API from here:

    _encode_blocks(x, out)   x:   (k, block_size) float32, finite     -> out: (k, type_size) uint8
    _decode_blocks(raw, out) raw: (k * type_size,) uint8, maybe r/o -> out: (k, block_size) float32

Both work on whole groups of blocks with NumPy; the only Python loop is over chunks of
blocks, which keeps temporaries small (cache-friendly) without costing per-block overhead.

A type slm can read but not write (a k-quant whose ggml quantizer we do not port) derives
from `DecodeOnlyCodec`: its `quantize` refuses with a QuantError naming the type.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from . import registry
from .errors import QuantError

# Inside the block primitives, IEEE overflow and invalid operations are expected, not bugs:
# GGML stores a scale beyond float16 range as inf, 1/d of a tiny scale is inf, and decoding an
# inf scale gives inf/NaN (see rounding.py). NumPy would warn about each; we silence exactly
# those two warning kinds around the primitives (division by zero stays loud).
_GGML_IEEE = dict(over="ignore", invalid="ignore")

# Elements handled per chunk. Big enough that NumPy call overhead vanishes, small enough that
# a chunk's temporaries (a few float32 copies of it: ~4 MiB each) stay in cache/RAM cheaply.
CHUNK_ELEMENTS = 1 << 20


def all_finite_floats(values: np.ndarray) -> bool:
    """Whether every IEEE float in `values` (any shape or strides: a block field is a strided
    view) is finite: no value has the all-ones exponent of inf and NaN. Read as integers, one
    AND and one max over the field: np.isfinite on a strided float16 field converts each value
    to a wider float first, and an import checks every block's scale of a whole base (the A/B
    in the commit that added this). Anything but a 2-, 4- or 8-byte float is left to np.isfinite."""
    exponent = _EXPONENT_BITS.get(values.dtype.itemsize) if values.dtype.kind == "f" else None
    if exponent is None:
        return bool(np.isfinite(values).all())
    if values.size == 0:
        return True
    bits = values.view(values.dtype.str.replace("f", "u"))  # same width and byte order
    return int((bits & exponent).max()) != exponent


# the exponent field of an IEEE binary16, binary32 and binary64, by width in bytes
_EXPONENT_BITS = {2: 0x7C00, 4: 0x7F800000, 8: 0x7FF0000000000000}

ShapeLike = int | Sequence[int]
BufferLike = np.ndarray | bytes | bytearray | memoryview


def as_byte_array(data: object) -> np.ndarray:
    """A flat uint8 view of `data` (ndarray, bytes, memoryview, mmap, ...), copying only if
    an ndarray is not contiguous. Read-only buffers give read-only views, which is all the
    decoders need."""
    if isinstance(data, np.ndarray):
        # Any dtype is fine (GGUFReader hands out f16 tensors as float16 arrays); we only
        # want its bytes. ascontiguousarray is a no-op on contiguous input.
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(data, dtype=np.uint8)  # type: ignore[call-overload]
    except (TypeError, ValueError) as exc:
        raise QuantError(
            f"expected bytes, a buffer or a numpy array of encoded blocks, "
            f"got {type(data).__name__} ({exc})"
        ) from None


def normalize_shape(shape: ShapeLike) -> tuple[int, ...]:
    """A shape as a tuple of non-negative ints (an int means a 1-D shape)."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(int(d) for d in shape)
    except TypeError:
        raise QuantError(f"a shape is a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise QuantError(f"negative dimension in shape {dims}")
    return dims


class Codec(ABC):
    """One storage type. Instances are stateless singletons; get them via `get_codec`."""

    name: ClassVar[str]  # lowercase: "q4_1"
    ggml_type: ClassVar[int | None]  # GGML type id (Q4_1 = 3); None when GGML has no such type
    block_size: ClassVar[int]  # values per block
    type_size: ClassVar[int]  # bytes per block
    can_quantize: ClassVar[bool] = True  # False: dequantize only (see DecodeOnlyCodec)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # Every class that declares its own `name` is a storage type and registers one
        # instance; helper base classes (no name of their own) do not.
        if "name" not in cls.__dict__:
            return
        # (inspect.isabstract knows it may run before ABCMeta has finished the class.)
        if inspect.isabstract(cls):
            raise TypeError(
                f"codec {cls.__name__} must implement _encode_blocks and _decode_blocks"
            )
        for attr in ("ggml_type", "block_size", "type_size"):
            if not hasattr(cls, attr):
                raise TypeError(f"codec {cls.__name__} must set the class attribute {attr}")
        registry.register(cls())

    def __repr__(self) -> str:
        return (
            f"<codec {self.name}: ggml_type={self.ggml_type}, "
            f"{self.block_size} values in {self.type_size} bytes>"
        )

    # ----------------------------------------------------------------- shapes and sizes

    def byte_shape(self, shape: ShapeLike) -> tuple[int, ...]:
        """Shape of the uint8 array `quantize` returns for a float tensor of `shape`."""
        dims = normalize_shape(shape)
        if not dims:
            raise QuantError(f"{self.name}: cannot store a 0-d tensor, give it at least one axis")
        if dims[-1] % self.block_size:
            raise QuantError(
                f"{self.name}: last dimension {dims[-1]} of shape {dims} is not a multiple "
                f"of the block size {self.block_size}"
            )
        return (*dims[:-1], dims[-1] // self.block_size * self.type_size)

    def nbytes(self, shape: ShapeLike) -> int:
        """Bytes needed to store a tensor of `shape`."""
        return math.prod(self.byte_shape(shape))

    # ----------------------------------------------------------------- quantize

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """Encode `x` (any real dtype, converted to float32 first, as gguf does).

        Returns uint8 of shape (*x.shape[:-1], x.shape[-1] // block_size * type_size).
        Raises QuantError for non-finite values or a last dimension that is not a multiple
        of the block size, and for a decode-only type.
        """
        if not self.can_quantize:
            raise QuantError(f"{self.name}: slm reads this type but cannot quantize to it")
        x32 = self._finite_float32(x)
        out = np.empty(self.byte_shape(x32.shape), dtype=np.uint8)
        n_blocks = x32.size // self.block_size
        blocks = x32.reshape(n_blocks, self.block_size)  # (n_blocks, block_size)
        encoded = out.reshape(n_blocks, self.type_size)  # (n_blocks, type_size), a view
        step = max(1, CHUNK_ELEMENTS // self.block_size)
        with np.errstate(**_GGML_IEEE):
            for start in range(0, n_blocks, step):
                self._encode_blocks(blocks[start : start + step], encoded[start : start + step])
        return out

    def _real_array(self, x: object) -> np.ndarray:
        """`x` as an ndarray of a real numeric dtype with at least one axis."""
        arr = np.asarray(x)
        if arr.dtype.kind not in "biuf":
            raise QuantError(f"{self.name}: cannot quantize values of dtype {arr.dtype}")
        self.byte_shape(arr.shape)  # validates ndim and the block multiple
        return arr

    def _finite_float32(self, x: object) -> np.ndarray:
        """`x` as a C-contiguous float32 array, after checking every value is finite."""
        arr = self._real_array(x)
        with np.errstate(over="ignore"):  # float64 beyond float32 range -> inf, reported below
            x32 = np.ascontiguousarray(arr, dtype=np.float32)
        if not np.isfinite(x32).all():
            raise QuantError(self._non_finite_message(arr, x32))
        return x32

    def _non_finite_message(self, original: np.ndarray, converted: np.ndarray) -> str:
        n_nan = int(np.isnan(converted).sum())
        n_inf = int(np.isinf(converted).sum())
        msg = f"{self.name}: cannot quantize non-finite values ({n_nan} NaN, {n_inf} inf)"
        # A float64 like 1e39 is finite but becomes inf as float32: say so, or the message
        # would contradict what the caller sees in their own array.
        overflowed = n_inf - int(np.isinf(original).sum()) if original.dtype.kind == "f" else n_inf
        if overflowed:
            msg += f"; {overflowed} of the inf came from overflow converting to float32"
        return msg

    @abstractmethod
    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:
        """x: (k, block_size) float32, all finite -> out: (k, type_size) uint8, C-contiguous."""

    # ----------------------------------------------------------------- dequantize

    def dequantize(self, data: BufferLike, shape: ShapeLike) -> np.ndarray:
        """Decode the bytes of a tensor of `shape` into a new float32 array of that shape.

        `data` may be a read-only buffer (an mmap slice); it is read in place, not copied.
        """
        dims = normalize_shape(shape)
        out = np.empty(dims, dtype=np.float32)
        return self.dequantize_into(data, dims, out)

    def dequantize_into(self, data: BufferLike, shape: ShapeLike, out: np.ndarray) -> np.ndarray:
        """Decode into `out`, a preallocated writable C-contiguous float32 array of `shape`.

        Lets a runtime reuse one scratch buffer instead of allocating per call. Returns `out`.
        """
        dims = normalize_shape(shape)
        raw = self._checked_bytes(data, dims)
        if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != dims:
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise QuantError(f"{self.name}: out must be a float32 array of shape {dims}, got {got}")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise QuantError(f"{self.name}: out must be a writable C-contiguous array")
        n_blocks = out.size // self.block_size
        blocks_out = out.reshape(n_blocks, self.block_size)  # (n_blocks, block_size), a view
        step = max(1, CHUNK_ELEMENTS // self.block_size)
        with np.errstate(**_GGML_IEEE):
            for start in range(0, n_blocks, step):
                stop = min(start + step, n_blocks)
                self._decode_blocks(
                    raw[start * self.type_size : stop * self.type_size], blocks_out[start:stop]
                )
        return out

    # ----------------------------------------------------------------- finiteness

    #: The block as a structured dtype and the fields (scale, minimum) whose finiteness makes
    #: every decoded value finite. With both set, `all_finite` reads only those fields; a codec
    #: that sets neither is checked by decoding, which is correct for every type.
    block_dtype: ClassVar[np.dtype | None] = None
    scale_fields: ClassVar[tuple[str, ...]] = ()

    def all_finite(self, data: BufferLike, shape: ShapeLike) -> bool:
        """Whether every value the bytes of a tensor of `shape` decode to is finite (import
        refuses a NaN or inf weight; stored bytes could hold either)."""
        dims = normalize_shape(shape)
        raw = self._checked_bytes(data, dims)
        if self.block_dtype is not None and self.scale_fields:
            blocks = raw.view(self.block_dtype)  # (n_blocks,) zero-copy
            return all(all_finite_floats(blocks[f]) for f in self.scale_fields)
        step = max(1, CHUNK_ELEMENTS // self.block_size)
        out = np.empty((min(step, raw.size // self.type_size), self.block_size), np.float32)
        with np.errstate(**_GGML_IEEE):
            for start in range(0, raw.size // self.type_size, step):
                part = raw[start * self.type_size:(start + step) * self.type_size]
                k = part.size // self.type_size
                self._decode_blocks(part, out[:k])
                if not np.isfinite(out[:k]).all():
                    return False
        return True

    def _checked_bytes(self, data: BufferLike, dims: tuple[int, ...]) -> np.ndarray:
        """Flat uint8 view of `data`, after checking it holds exactly a tensor of `dims`."""
        expected = self.nbytes(dims)
        raw = as_byte_array(data)
        if raw.size != expected:
            raise QuantError(
                f"{self.name}: a tensor of shape {dims} takes {expected} bytes, got {raw.size}"
            )
        return raw

    @abstractmethod
    def _decode_blocks(self, raw: np.ndarray, out: np.ndarray) -> None:
        """raw: (k * type_size,) uint8, possibly read-only -> out: (k, block_size) float32."""


class DecodeOnlyCodec(Codec):
    """A type slm dequantizes (GGUF files carry it) but never produces."""

    can_quantize = False

    def _encode_blocks(self, x: np.ndarray, out: np.ndarray) -> None:  # quantize refuses first
        raise AssertionError(f"{self.name} is decode-only")
