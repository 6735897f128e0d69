"""Llama-family conventions shared by the GGUF and Hugging Face readers.

slm names tensors the GGUF way (token_embd.weight, blk.N.attn_q.weight, ...) whatever the
source, so the executor and adapters deal with one naming scheme. Shapes are NumPy order:
a linear layer's weight is (out_features, in_features).
"""

from __future__ import annotations

import re

from slm.errors import InvalidInput

# Hugging Face suffix -> GGUF suffix, per decoder layer.
HF_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
HF_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight")

# How the rows of attn_q / attn_k are ordered within each head:
#   "hf"   -- Hugging Face: the two RoPE halves are [0, d/2) and [d/2, d) ("rotate_half")
#   "gguf" -- llama.cpp's converter interleaves them: rows (0, d/2), (1, d/2+1), ... become
#             adjacent pairs, matching GGML's "normal" RoPE that rotates pairs (2i, 2i+1).
QK_LAYOUTS = ("hf", "gguf")

ARCH_FIELDS = (
    "family", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
    "num_kv_heads", "head_dim", "context_length", "rms_norm_eps", "rope_theta",
    "tie_word_embeddings",
)


def hf_to_gguf_name(hf_name: str) -> str | None:
    if hf_name in HF_GLOBAL_NAMES:
        return HF_GLOBAL_NAMES[hf_name]
    m = _HF_LAYER.fullmatch(hf_name)
    if m and m.group(2) in HF_LAYER_NAMES:
        return f"blk.{m.group(1)}.{HF_LAYER_NAMES[m.group(2)]}.weight"
    return None


def gguf_to_hf_module(gguf_name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj' (for adapter mapping)."""
    for hf, gg in HF_GLOBAL_NAMES.items():
        if gg == gguf_name:
            return hf.removesuffix(".weight")
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
    if m:
        for hf_suffix, gg_suffix in HF_LAYER_NAMES.items():
            if gg_suffix == m.group(2):
                return f"model.layers.{m.group(1)}.{hf_suffix}"
    return None


def expected_shapes(arch: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama base must have, with its NumPy shape."""
    h, f, v = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"]
    hd, nh, nkv = arch["head_dim"], arch["num_heads"], arch["num_kv_heads"]
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (v, h),
        "output_norm.weight": (h,),
    }
    if not arch["tie_word_embeddings"]:
        shapes["output.weight"] = (v, h)
    for i in range(arch["num_layers"]):
        p = f"blk.{i}."
        shapes[p + "attn_norm.weight"] = (h,)
        shapes[p + "ffn_norm.weight"] = (h,)
        shapes[p + "attn_q.weight"] = (nh * hd, h)
        shapes[p + "attn_k.weight"] = (nkv * hd, h)
        shapes[p + "attn_v.weight"] = (nkv * hd, h)
        shapes[p + "attn_output.weight"] = (h, nh * hd)
        shapes[p + "ffn_gate.weight"] = (f, h)
        shapes[p + "ffn_up.weight"] = (f, h)
        shapes[p + "ffn_down.weight"] = (h, f)
    return shapes


def check_architecture(arch: dict, source: str) -> dict:
    for key in ARCH_FIELDS:
        if key not in arch:
            raise InvalidInput(f"{source}: missing architecture field {key}")
    ints = [k for k in ARCH_FIELDS if k not in ("family", "rms_norm_eps", "rope_theta",
                                                 "tie_word_embeddings")]
    for key in ints:
        value = arch[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 1 << 31:
            raise InvalidInput(f"{source}: architecture field {key}={value!r} is not a positive integer")
    if arch["num_heads"] % arch["num_kv_heads"]:
        raise InvalidInput(f"{source}: num_heads is not a multiple of num_kv_heads")
    if arch["head_dim"] % 2:
        raise InvalidInput(f"{source}: head_dim must be even for RoPE")
    for key in ("rms_norm_eps", "rope_theta"):
        if not isinstance(arch[key], float) or not arch[key] > 0:
            raise InvalidInput(f"{source}: architecture field {key}={arch[key]!r} is not a positive number")
    return arch


def check_tensors(arch: dict, shapes: dict[str, tuple[int, ...]], source: str) -> None:
    """The tensor table must be exactly what the architecture implies (extra tensors such as
    rope_freqs are tolerated only if listed in IGNORED_EXTRA)."""
    expected = expected_shapes(arch)
    missing = sorted(set(expected) - set(shapes))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise InvalidInput(f"{source}: missing tensors {', '.join(missing[:3])}{more}")
    for name, shape in expected.items():
        if tuple(shapes[name]) != shape:
            raise InvalidInput(f"{source}: tensor {name} has shape {tuple(shapes[name])}, expected {shape}")
    extra = sorted(set(shapes) - set(expected))
    if extra:
        raise InvalidInput(f"{source}: unexpected tensors for a Llama model: {', '.join(extra[:3])}")


def permute_hf_to_gguf(rows, n_heads: int):
    """Reorder rows of a q/k projection (or anything indexed by its output rows) from the
    Hugging Face layout into llama.cpp's GGUF layout.

    rows: (n_heads * head_dim, ...) -> same shape. Per head, row j of the first half and row j
    of the second half become rows 2j and 2j+1.
    """
    shape = rows.shape
    head_dim = shape[0] // n_heads
    # (n_heads, 2, head_dim/2, ...) -> swap the half axis inward -> (n_heads, head_dim/2, 2, ...)
    return rows.reshape(n_heads, 2, head_dim // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def permute_gguf_to_hf(rows, n_heads: int):
    """Inverse of permute_hf_to_gguf."""
    shape = rows.shape
    head_dim = shape[0] // n_heads
    return rows.reshape(n_heads, head_dim // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
