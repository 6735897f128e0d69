"""What each supported decoder family is: one description per family, read by everything else.

A description (`Architecture`) says how the family's block is built and how its checkpoints
are laid out; the per-model numbers (sizes, eps, RoPE bases, windows) live in the base
manifest's [architecture] table. The executor, the oracle and the readers read the fields
below and never name a family: adding one is writing slm/arch/<family>.py and listing it in
FAMILIES (docs/architectures.md walks through it).

The block every family shares (optional parts in brackets, the flag that turns them on):

    x = embed(tokens) [* sqrt(hidden)]                                  embedding_scale
    for each layer:
        h = rms_norm(x, attn_norm)
        q, k, v = h Wq^T [+ bq], h Wk^T [+ bk], h Wv^T [+ bv]              qkv_bias
        [q, k = rms_norm per head (attn_q_norm, attn_k_norm)]            qk_norm
        q, k = rope(q, k) with the layer's base (rope_theta or rope_theta_local)
        a = attention(q * query_pre_attn_scalar^-1/2, k, v), causal, within the layer's window
        a = a Wo^T [; rms_norm(a, post_attention_norm)]                  post_norms
        x = x + a
        h = rms_norm(x, ffn_norm)
        f = (act(h Wgate^T) * h Wup^T) Wdown^T [; rms_norm(f, post_ffw_norm)]   activation, post_norms
        x = x + f
    logits = rms_norm(x, output_norm) Wout^T (Wout = the embedding when tied)
             [; c * tanh(logits / c)]                                    final_logit_softcap

Norm weights are stored as the factor they multiply by. Gemma's Hugging Face checkpoints hold
w with the factor 1 + w; GGUF already holds 1 + w (llama.cpp's converter adds 1). slm stores
the factor: the HF reader adds `hf_norm_offset` on import, the executor adds nothing.

This package imports nothing from slm but slm.errors: the readers (slm.formats) and the
executor (slm.model) both read it, so it sits below both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from slm.errors import InvalidInput

# Per-model fields every family records, with their types.
COMMON_FIELDS: dict[str, type] = {
    "family": str, "vocab_size": int, "hidden_size": int, "intermediate_size": int,
    "num_layers": int, "num_heads": int, "num_kv_heads": int, "head_dim": int,
    "context_length": int, "rms_norm_eps": float, "rope_theta": float,
    "tie_word_embeddings": bool,
}

# Per-model fields a family may add (Architecture.fields), with their types. A family that does
# not record one behaves as `hyperparameters` fills it in.
OPTIONAL_FIELDS: dict[str, type] = {
    "sliding_window": int,  # positions a sliding layer's query sees, itself included
    "layer_types": list,  # per layer: "sliding_attention" or "full_attention"
    "rope_theta_local": float,  # RoPE base of the sliding layers (rope_theta: of the full ones)
    "query_pre_attn_scalar": float,  # attention scores are scaled by its -1/2 power
    "final_logit_softcap": float,  # logits = c * tanh(logits / c); 0 = none
}
LAYER_TYPES = ("full_attention", "sliding_attention")

ACTIVATIONS = ("silu", "gelu_tanh")  # of the gate, times up: SwiGLU, GeGLU (tanh approximation)
# config.json's hidden_act / hidden_activation -> the activation it means
HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}

# How the rows of attn_q / attn_k are ordered within each head (= which pairs RoPE rotates):
#   "hf"   -- Hugging Face: the two RoPE halves are [0, d/2) and [d/2, d) ("rotate_half"; GGML's
#             NEOX RoPE, which llama.cpp uses for Gemma 3 and Qwen)
#   "gguf" -- llama.cpp's converter interleaves them for the Llama family: rows (0, d/2),
#             (1, d/2+1), ... become adjacent pairs, matching GGML's "normal" RoPE (2i, 2i+1).
QK_LAYOUTS = ("hf", "gguf")

# Hugging Face module -> slm (GGUF) name. Linear layers and whole-model tensors are named alike
# in every family here; each family adds its norms (Architecture.hf_norms).
HF_LINEARS = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
HF_GLOBALS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

REQUIRED = object()
MetaReader = Callable[..., Any]  # meta(key relative to "<gguf_arch>.", default=REQUIRED)


@dataclass(frozen=True)
class Architecture:
    family: str  # the manifest's architecture.family
    gguf_arch: str  # GGUF general.architecture, also the prefix of its metadata keys
    hf_model_types: tuple[str, ...]  # config.json model_type values read as this family
    activation: str  # one of ACTIVATIONS
    hf_norms: dict[str, str]  # HF module within a layer -> slm name of each norm the block has
    gguf_qk_row_layout: str  # q/k rows of a GGUF from llama.cpp's converter (QK_LAYOUTS)
    post_norms: bool = False  # post_attention_norm and post_ffw_norm before each residual add
    qk_norm: bool = False  # attn_q_norm, attn_k_norm: per-head RMSNorm of q and k before RoPE
    qkv_bias: bool = False  # attn_q.bias, attn_k.bias, attn_v.bias
    embedding_scale: bool = False  # the embedding rows are multiplied by sqrt(hidden_size)
    hf_norm_offset: float = 0.0  # HF stores (factor - offset) for every norm weight
    fields: tuple[str, ...] = ()  # OPTIONAL_FIELDS this family records in its manifest
    # The family's own fields from GGUF metadata and from config.json (the common ones are
    # read by slm.formats): (meta, common fields) -> {field: value} and (config, common) -> ...
    from_gguf: Callable[[MetaReader, dict], dict] = field(default=lambda meta, common: {}, repr=False)
    from_hf: Callable[[dict, dict], dict] = field(default=lambda config, common: {}, repr=False)

    @property
    def hf_layer_names(self) -> dict[str, str]:
        return {**HF_LINEARS, **self.hf_norms}

    @property
    def manifest_fields(self) -> tuple[str, ...]:
        return (*COMMON_FIELDS, *self.fields)


def get(family: str, source: str = "") -> Architecture:
    if family not in FAMILIES:
        where = f"{source}: " if source else ""
        raise InvalidInput(f"{where}architecture {family!r} is not supported "
                           f"(slm runs {', '.join(sorted(FAMILIES))})")
    return FAMILIES[family]


def by_gguf_arch(name: str, source: str) -> Architecture:
    for a in FAMILIES.values():
        if a.gguf_arch == name:
            return a
    raise InvalidInput(f"{source}: architecture {name!r} is not supported "
                       f"(slm runs {', '.join(sorted(a.gguf_arch for a in FAMILIES.values()))})")


def by_hf_model_type(model_type, source: str) -> Architecture:
    for a in FAMILIES.values():
        if model_type in a.hf_model_types:
            return a
    known = sorted(t for a in FAMILIES.values() for t in a.hf_model_types)
    raise InvalidInput(f"{source}: model_type {model_type!r} is not supported (slm runs {', '.join(known)})")


def layer_pattern(num_layers: int, every: int) -> list[str]:
    """Sliding layers with every `every`-th one full (Gemma 3: 5 sliding, then 1 full)."""
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers)]


def hyperparameters(arch: dict) -> dict:
    """Every common and optional field of a (checked) manifest table, the optional ones a family
    does not record filled in with what they mean for it: no sliding window, one RoPE base,
    scores scaled by head_dim^-1/2, no softcap."""
    out = dict(arch)
    out.setdefault("sliding_window", 0)
    out.setdefault("layer_types", ["full_attention"] * arch["num_layers"])
    out.setdefault("rope_theta_local", arch["rope_theta"])
    out.setdefault("query_pre_attn_scalar", float(arch["head_dim"]))
    out.setdefault("final_logit_softcap", 0.0)
    return out


def check(arch: dict, source: str) -> dict:
    """A manifest's [architecture] table: exactly its family's fields, each well formed."""
    family = arch.get("family")
    if not isinstance(family, str):
        raise InvalidInput(f"{source}: missing architecture field family")
    desc = get(family, source)
    expected = desc.manifest_fields
    for key in expected:
        if key not in arch:
            raise InvalidInput(f"{source}: missing architecture field {key}")
    extra = sorted(set(arch) - set(expected))
    if extra:
        raise InvalidInput(f"{source}: architecture field {extra[0]} is not one of {family}'s")
    types = {**COMMON_FIELDS, **OPTIONAL_FIELDS}
    for key in expected:
        value, kind = arch[key], types[key]
        if kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31
            ok = ok or (key == "sliding_window" and value == 0)
            what = "a positive integer"
        elif kind is float:
            ok = isinstance(value, float) and math.isfinite(value) and value > 0
            ok = ok or (key == "final_logit_softcap" and value == 0.0)
            what = "a positive number"
        elif kind is bool:
            ok, what = isinstance(value, bool), "true or false"
        elif kind is list:
            ok = isinstance(value, list) and len(value) == arch["num_layers"] and \
                all(v in LAYER_TYPES for v in value)
            what = f"a list of {arch['num_layers']} of {', '.join(LAYER_TYPES)}"
        else:
            ok, what = isinstance(value, str), "a string"
        if not ok:
            raise InvalidInput(f"{source}: architecture field {key}={value!r} is not {what}")
    if arch["num_heads"] % arch["num_kv_heads"]:
        raise InvalidInput(f"{source}: num_heads is not a multiple of num_kv_heads")
    if arch["head_dim"] % 2:
        raise InvalidInput(f"{source}: head_dim must be even for RoPE")
    if "sliding_attention" in arch.get("layer_types", ()) and not arch.get("sliding_window"):
        raise InvalidInput(f"{source}: sliding layers need a sliding_window")
    return arch


# The families, registered last: their modules import the definitions above.
from slm.arch import gemma3, llama, qwen2, qwen3  # noqa: E402

FAMILIES: dict[str, Architecture] = {a.family: a for a in (llama.ARCH, gemma3.ARCH, qwen2.ARCH, qwen3.ARCH)}
