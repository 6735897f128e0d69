"""Quantization codecs: float tensors <-> the bytes of GGUF (and NF4) tensor storage.

    from slm.quant import get_codec
    codec = get_codec("q4_1")            # or get_codec(3), the GGML type id
    raw = codec.quantize(weights)        # uint8, (..., n // 32 * 20)
    back = codec.dequantize(raw, weights.shape)

Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are bit-exact with gguf-py's reference (gguf.quants) in both
directions. The k-quants Q2_K .. Q6_K decode bit-exactly like gguf-py; Q4_K and Q6_K also
quantize, bit-exactly like ggml's C reference (quantize_row_q4_K_ref / _q6_K_ref); Q2_K, Q3_K
and Q5_K are decode only. GGML type ids and names: ggml_types.GGMLType, the one such table.
"""

from __future__ import annotations

# Importing the type modules runs their class statements, which registers the codecs.
from . import float_types, nf4, q4_0, q4_1, q5_0, q5_1, q8_0  # noqa: F401
from . import q2_k, q3_k, q4_k, q5_k, q6_k  # noqa: F401  (k-quants)
from .base import Codec
from .errors import QuantError
from .ggml_types import GGMLType, ggml_type_label
from .registry import SUPPORTED_GGML_TYPES, by_ggml_type, codec_names, get_codec

__all__ = [
    "Codec",
    "GGMLType",
    "QuantError",
    "SUPPORTED_GGML_TYPES",
    "by_ggml_type",
    "codec_names",
    "get_codec",
    "ggml_type_label",
]
