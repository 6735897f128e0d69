"""Gemma 3 (text): four norms per block, GeGLU, q/k norms, scaled embeddings, sliding windows.

What differs from Llama, and where each number comes from:

    block           attn_norm -> attention -> post_attention_norm -> + x
                    ffn_norm -> GeGLU (gelu, tanh approximation) -> post_ffw_norm -> + x
    q/k             per-head RMSNorm (attn_q_norm, attn_k_norm) before RoPE
    embedding       rows * sqrt(hidden_size) (float32, as both transformers and llama.cpp do)
    norm weights    every RMSNorm multiplies by 1 + w; HF stores w (Gemma3RMSNorm), GGUF stores
                    1 + w (convert_hf_to_gguf.py adds 1 to every "*norm.weight")
    attention       scores * query_pre_attn_scalar^-1/2. config.json has the scalar; a GGUF has
                    no key for it: llama.cpp uses head_dim, or hidden/heads for the 62-layer
                    27B (llama-model.cpp, f_attention_scale; it equals the HF config there)
    layers          5 sliding, 1 full, repeated (config.json layer_types; a GGUF has no pattern
                    key: llama.cpp hard-codes set_swa_pattern(6), layer i full iff i % 6 == 5).
                    A sliding layer's query at p sees keys p - window + 1 .. p (window =
                    sliding_window: config.json, GGUF attention.sliding_window)
    RoPE            rope_theta (GGUF rope.freq_base, 1e6) on full layers, rope_theta_local on
                    sliding ones (config.json rope_local_base_freq or rope_parameters
                    .sliding_attention; GGUF: none, llama.cpp hard-codes 10000)
    softcapping     no attention softcap (Gemma 2 had 50; convert_hf_to_gguf.py asserts Gemma 3
                    has none); final_logit_softcapping is None in every Gemma 3 config (Gemma 2
                    had 30) but is honoured when set
    q/k rows        NEOX RoPE in llama.cpp: the converter does not permute them
    output          tied to the embedding (llama.cpp's converter drops lm_head)
"""

from slm.arch import Architecture, layer_pattern
from slm.errors import InvalidInput

LLAMA_CPP_PATTERN = 6
LLAMA_CPP_LOCAL_THETA = 10000.0
LLAMA_CPP_27B_LAYERS = 62


def _from_gguf(meta, common: dict) -> dict:
    window = int(meta("attention.sliding_window", 0))
    layers = common["num_layers"]
    scalar = common["hidden_size"] // common["num_heads"] if layers == LLAMA_CPP_27B_LAYERS \
        else common["head_dim"]
    return {
        "sliding_window": window,
        "layer_types": layer_pattern(layers, LLAMA_CPP_PATTERN) if window else ["full_attention"] * layers,
        "rope_theta_local": LLAMA_CPP_LOCAL_THETA,
        "query_pre_attn_scalar": float(scalar),
        "final_logit_softcap": float(meta("final_logit_softcapping", 0.0) or 0.0),
    }


def _from_hf(config: dict, common: dict) -> dict:
    for key, what in (("attn_logit_softcapping", "attention logit softcapping"),
                      ("use_bidirectional_attention", "bidirectional attention")):
        if config.get(key):
            raise InvalidInput(f"{what} ({key}) is not supported")
    layers = common["num_layers"]
    types = config.get("layer_types")
    if types is None:
        every = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", LLAMA_CPP_PATTERN))
        types = layer_pattern(layers, int(every))
    rope = config.get("rope_parameters") or {}
    local = (rope.get("sliding_attention") or {}).get("rope_theta",
                                                       config.get("rope_local_base_freq", LLAMA_CPP_LOCAL_THETA))
    window = config.get("sliding_window") or 0
    return {
        "sliding_window": int(window),
        "layer_types": list(types) if window else ["full_attention"] * layers,
        "rope_theta_local": float(local),
        "query_pre_attn_scalar": float(config.get("query_pre_attn_scalar", 256)),  # HF's default
        "final_logit_softcap": float(config.get("final_logit_softcapping") or 0.0),
    }


ARCH = Architecture(
    family="gemma3",
    gguf_arch="gemma3",
    hf_model_types=("gemma3_text",),
    activation="gelu_tanh",
    hf_norms={
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
    },
    gguf_qk_row_layout="hf",
    post_norms=True,
    qk_norm=True,
    embedding_scale=True,
    hf_norm_offset=1.0,
    fields=("sliding_window", "layer_types", "rope_theta_local", "query_pre_attn_scalar",
            "final_logit_softcap"),
    from_gguf=_from_gguf,
    from_hf=_from_hf,
)
