"""Lookup of codec instances by name ("q4_1", "Q4_1") or by GGML type id (3).

Codec subclasses register themselves when their class statement runs (Codec.__init_subclass__
calls `register`); load_codecs imports every codec module, and every lookup here calls it
first, so the registry is complete whoever asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .errors import QuantError
from .ggml_types import GGMLType, ggml_type_label
from .layouts import LAYOUTS

if TYPE_CHECKING:
    from .base import Codec

_BY_NAME: dict[str, Codec] = {}
_BY_GGML_TYPE: dict[int, Codec] = {}

# GGML type id -> codec name, for the types that have an id (nf4 has none).
SUPPORTED_GGML_TYPES: dict[int, str] = {}


_CODEC_MODULES = ("float_types", "nf4", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                  "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
_loaded = False


def load_codecs() -> None:
    """Import every codec module (each registers its codecs); once."""
    global _loaded
    if not _loaded:
        from importlib import import_module

        for module in _CODEC_MODULES:
            import_module(f"slm.quant.{module}")
        _loaded = True


def register(codec: Codec) -> None:
    """Add one codec instance; a clashing name or id, or a layout that disagrees with
    layouts.LAYOUTS, is a programming error."""
    if codec.name != codec.name.lower() or not codec.name:
        raise TypeError(f"codec name must be non-empty lowercase, got {codec.name!r}")
    if LAYOUTS.get(codec.name) != (codec.block_size, codec.type_size):
        raise TypeError(f"codec {codec.name!r}: {codec.block_size} values in {codec.type_size} bytes, "
                        f"but slm.quant.layouts says {LAYOUTS.get(codec.name)}")
    if codec.name in _BY_NAME:
        raise TypeError(f"codec name {codec.name!r} registered twice")
    if codec.ggml_type is not None:
        # One table of ids and names (ggml_types.py): a codec must agree with it.
        if GGMLType(codec.ggml_type).name.lower() != codec.name:
            raise TypeError(f"codec {codec.name!r} does not match GGML type {codec.ggml_type}")
        if codec.ggml_type in _BY_GGML_TYPE:
            raise TypeError(f"GGML type {codec.ggml_type} registered twice")
        _BY_GGML_TYPE[codec.ggml_type] = codec
        SUPPORTED_GGML_TYPES[codec.ggml_type] = codec.name
    _BY_NAME[codec.name] = codec


def codec_names() -> list[str]:
    """Names of all registered codecs, sorted."""
    load_codecs()
    return sorted(_BY_NAME)


def by_ggml_type(ggml_type: int) -> Codec | None:
    """The codec for a GGML type id, or None when slm does not support that type."""
    load_codecs()
    return _BY_GGML_TYPE.get(int(ggml_type))


def _supported() -> str:
    ids = {c.name: c.ggml_type for c in _BY_NAME.values()}
    return ", ".join(
        name if ids[name] is None else f"{name} (ggml type {ids[name]})" for name in codec_names()
    )


def _unsupported(type_id: int) -> QuantError:
    return QuantError(
        f"unsupported GGML tensor type {ggml_type_label(type_id)}; supported: {_supported()}"
    )


def get_codec(name_or_ggml_type: str | int) -> Codec:
    """The codec named "q4_1"/"Q4_1", or the one for a GGML type id such as 3.

    Also accepts numpy integers and gguf's GGMLQuantizationType (an IntEnum).
    """
    load_codecs()
    key = name_or_ggml_type
    # bool is an int subclass, but get_codec(True) is surely a bug, not "f16".
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        codec = _BY_GGML_TYPE.get(int(key))
        if codec is None:
            raise _unsupported(int(key))
        return codec
    if isinstance(key, str):
        name = key.strip().lower()
        codec = _BY_NAME.get(name)
        if codec is None:
            # A GGML type slm cannot handle (iq2_xxs) is named as such, not as a typo.
            if name.upper() in GGMLType.__members__:
                raise _unsupported(GGMLType[name.upper()])
            raise QuantError(f"unknown quantization type {key!r}; supported: {_supported()}")
        return codec
    raise QuantError(
        f"a quantization type is a name or a GGML type id, not {type(key).__name__}; "
        f"supported: {_supported()}"
    )
