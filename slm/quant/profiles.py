"""Import profiles (`slm import base --quant P`): the storage type of each tensor of a checkpoint.

A single-type profile ("q4_k") stores every matrix in that type; "q4_k_m" is llama.cpp's
Q4_K_M mix. Vectors (norms) always stay f32. Tensors are named as in GGUF ("blk.3.attn_v.weight").

A row length the type's block does not divide takes llama.cpp's fallback
(src/llama-quant.cpp, tensor_type_fallback): Q4_K -> Q5_0, Q6_K -> Q8_0, and F16 when even the
fallback's 32-value block does not divide it (for the 32/64-value types too).
"""

from __future__ import annotations

import re

from .registry import get_codec

SINGLE_TYPE = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q6_k", "nf4", "f16", "f32")
MIXES = ("q4_k_m",)
PROFILES = SINGLE_TYPE + MIXES

# llama.cpp tensor_type_fallback, for the 256-value types slm quantizes to.
_FALLBACK = {"q4_k": "q5_0", "q6_k": "q8_0"}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(attn_v|ffn_down)\.weight")


def tensor_type(
    profile: str, name: str, shape: tuple[int, ...], n_layers: int, tied_embeddings: bool
) -> str:
    """The codec name for tensor `name` of `shape` under `profile` (one of PROFILES)."""
    if len(shape) == 1:
        return "f32"  # norms stay exact
    target = _q4_k_m(name, shape[-1], n_layers, tied_embeddings) if profile == "q4_k_m" else profile
    return fallback(target, shape[-1])


def fallback(codec_name: str, row_length: int) -> str:
    """`codec_name` if its block divides `row_length`, else llama.cpp's fallback type."""
    if row_length % get_codec(codec_name).block_size == 0:
        return codec_name
    second = _FALLBACK.get(codec_name)
    if second is not None and row_length % get_codec(second).block_size == 0:
        return second
    return "f16"


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third
    layer in between (C integer division; `layer - n/8 >= 0` whenever the modulo is reached)."""
    eighth = n_layers // 8
    return layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2


def _q4_k_m(name: str, row_length: int, n_layers: int, tied_embeddings: bool) -> str:
    """llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M choice (src/llama-quant.cpp,
    llama_tensor_get_type_impl) for a dense model without an importance matrix:

      * output.weight, or token_embd.weight when it doubles as the output (tied): Q6_K,
        or Q8_0 when the row length is not a multiple of 256;
      * blk.N.attn_v.weight and blk.N.ffn_down.weight: Q6_K where use_more_bits(N, n_layers),
        else Q4_K (llama.cpp counts these tensors in file order, one per layer: the layer index);
      * every other matrix (token_embd when untied, attn_q/k/output, ffn_gate/up): Q4_K.

    Not taken over: the Falcon, mixture-of-experts and 70B-specific branches.
    """
    if name == "output.weight" or (tied_embeddings and name == "token_embd.weight"):
        return "q6_k" if row_length % 256 == 0 else "q8_0"
    match = _LAYER_TENSOR.fullmatch(name)
    if match and use_more_bits(int(match[1]), n_layers):
        return "q6_k"
    return "q4_k"
