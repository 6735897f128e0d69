"""Llama (and SmolLM2, and the other models llama.cpp runs as "llama"): the plain block.

Pre-norm RMSNorm, SwiGLU, no biases, one RoPE base. llama.cpp's converter permutes the q/k
rows of a Llama (LlamaModel.permute) because GGML's "normal" RoPE rotates adjacent pairs.
"""

from slm.arch import Architecture

ARCH = Architecture(
    family="llama",
    gguf_arch="llama",
    hf_model_types=("llama",),
    activation="silu",
    hf_norms={"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"},
    gguf_qk_row_layout="gguf",
)
