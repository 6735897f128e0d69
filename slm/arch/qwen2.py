"""Qwen2 / Qwen2.5: the Llama block with biases on q, k and v.

llama.cpp runs it with NEOX RoPE, so its converter leaves the q/k rows (and biases) in the
Hugging Face order. config.json's use_sliding_window (off in every released Qwen2.5) is
refused by the HF reader: llama.cpp ignores it, so the two formats would disagree.
"""

from slm.arch import Architecture

ARCH = Architecture(
    family="qwen2",
    gguf_arch="qwen2",
    hf_model_types=("qwen2",),
    activation="silu",
    hf_norms={"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"},
    gguf_qk_row_layout="hf",
    qkv_bias=True,
)
