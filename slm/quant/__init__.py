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

# Importing the type modules runs their class statements, which registers the codecs; that
# imports NumPy, so it happens on first use of what this package exports (PEP 562), not on
# `import slm.quant`: `slm activate` needs only the numpy-free slm.quant.layouts.
_EXPORTS = {
    "Codec": "base",
    "GGMLType": "ggml_types",
    "QuantError": "errors",
    "SUPPORTED_GGML_TYPES": "registry",
    "by_ggml_type": "registry",
    "codec_names": "registry",
    "get_codec": "registry",
    "ggml_type_label": "ggml_types",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    from .registry import load_codecs

    load_codecs()
    value = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
