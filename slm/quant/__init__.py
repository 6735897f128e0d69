"""Quantization codecs: float tensors <-> the bytes of GGUF (and NF4) tensor storage.

    from slm.quant import get_codec
    codec = get_codec("q4_1")            # or get_codec(3), the GGML type id
    raw = codec.quantize(weights)        # uint8, (..., n // 32 * 20)
    back = codec.dequantize(raw, weights.shape)

Q8_0, Q4_0 and Q4_1 are bit-exact with gguf-py's reference (gguf.quants) in both directions.
"""

from __future__ import annotations

# Importing the type modules runs their class statements, which registers the codecs.
from . import float_types, nf4, q4_0, q4_1, q8_0  # noqa: F401
from .base import Codec
from .errors import QuantError
from .registry import SUPPORTED_GGML_TYPES, by_ggml_type, codec_names, get_codec

__all__ = [
    "Codec",
    "QuantError",
    "SUPPORTED_GGML_TYPES",
    "by_ggml_type",
    "codec_names",
    "get_codec",
]
