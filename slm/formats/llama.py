"""Tensor names and shapes of the decoder families (slm.arch), shared by the GGUF and Hugging
Face readers. (Named after the Llama family, the first one; the rules below cover them all.)

slm names tensors the GGUF way (token_embd.weight, blk.N.attn_q.weight, blk.N.attn_q.bias, ...)
whatever the source, so the executor and adapters deal with one naming scheme. Shapes are
NumPy order: a linear layer's weight is (out_features, in_features).
"""

from __future__ import annotations

import re

from slm import arch as archs
from slm.arch import HF_GLOBALS, Architecture
from slm.errors import InvalidInput

_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")
LLAMA = archs.get("llama")


def hf_to_gguf_name(hf_name: str, desc: Architecture = LLAMA) -> str | None:
    """'model.layers.3.self_attn.q_proj.weight' -> 'blk.3.attn_q.weight' (the linear layers are
    named alike in every family; norms follow `desc`)."""
    if hf_name in HF_GLOBALS:
        return HF_GLOBALS[hf_name]
    m = _HF_LAYER.fullmatch(hf_name)
    if m and m.group(2) in desc.hf_layer_names:
        return f"blk.{m.group(1)}.{desc.hf_layer_names[m.group(2)]}.{m.group(3)}"
    return None


def gguf_to_hf_module(gguf_name: str, desc: Architecture = LLAMA) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj' (for adapter mapping)."""
    for hf, gg in HF_GLOBALS.items():
        if gg == gguf_name:
            return hf.removesuffix(".weight")
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m:
        for hf_suffix, gg_suffix in desc.hf_layer_names.items():
            if gg_suffix == m.group(2):
                return f"model.layers.{m.group(1)}.{hf_suffix}"
    return None


def expected_shapes(arch: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor a base of this architecture must have, with its NumPy shape."""
    desc = archs.get(arch["family"])
    h, f, v = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"]
    hd, q, kv = arch["head_dim"], arch["num_heads"] * arch["head_dim"], arch["num_kv_heads"] * arch["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (v, h),
        "output_norm.weight": (h,),
    }
    if not arch["tie_word_embeddings"]:
        shapes["output.weight"] = (v, h)
    layer = {
        "attn_norm.weight": (h,), "ffn_norm.weight": (h,),
        "attn_q.weight": (q, h), "attn_k.weight": (kv, h), "attn_v.weight": (kv, h),
        "attn_output.weight": (h, q),
        "ffn_gate.weight": (f, h), "ffn_up.weight": (f, h), "ffn_down.weight": (h, f),
    }
    if desc.post_norms:
        layer |= {"post_attention_norm.weight": (h,), "post_ffw_norm.weight": (h,)}
    if desc.qk_norm:
        layer |= {"attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)}
    if desc.qkv_bias:
        layer |= {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
    for i in range(arch["num_layers"]):
        shapes |= {f"blk.{i}.{name}": shape for name, shape in layer.items()}
    return shapes


def check_tensors(arch: dict, shapes: dict[str, tuple[int, ...]], source: str) -> None:
    """The tensor table must be exactly what the architecture implies."""
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
        raise InvalidInput(f"{source}: unexpected tensors for a {arch['family']} model: {', '.join(extra[:3])}")


def permute_hf_to_gguf(rows, n_heads: int):
    """Reorder rows of a q/k projection (or anything indexed by its output rows) from the
    Hugging Face layout into llama.cpp's GGUF layout (slm.arch.QK_LAYOUTS).

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
