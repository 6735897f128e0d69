"""Qwen3 (dense): the Llama block with a per-head RMSNorm of q and k before RoPE, no biases,
and a head_dim of its own (config.json head_dim; GGUF attention.key_length).

NEOX RoPE in llama.cpp: q/k rows stay in the Hugging Face order.
"""

from slm.arch import Architecture

ARCH = Architecture(
    family="qwen3",
    gguf_arch="qwen3",
    hf_model_types=("qwen3",),
    activation="silu",
    hf_norms={"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"},
    gguf_qk_row_layout="hf",
    qk_norm=True,
)
