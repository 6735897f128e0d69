"""The Gemma 3, Qwen2 and Qwen3 fixtures of scripts/make_tiny_model.py (--arch): a tiny model of
each family, as a Hugging Face checkpoint and as GGUF files.

A standalone fixture module like make_tiny_model.py: it must not import `slm`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, LlamaFileType
from tiny_common import (BOS_TOKEN, CONTEXT, EOS_TOKEN, HIDDEN, INTERMEDIATE, N_HEADS, N_KV_HEADS, build_tokenizer,
                         tokenizer_tables, write_hf_common, write_tokenizer_and_tensors)
from tokenizers import Tokenizer

# --------------------------------------------------------------------------------------------
# Gemma 3, Qwen2, Qwen3: the Hugging Face side is built with transformers' own config and model
# classes (so transformers can load it by construction), the GGUF side the way
# convert_hf_to_gguf.py converts it: names from gguf-py's tensor map (the converter's), its
# metadata keys, +1 on every Gemma norm weight (Gemma3Model.norm_shift), no q/k permutation
# (llama.cpp runs these with NEOX RoPE), no output.weight when the head is tied.
# --------------------------------------------------------------------------------------------
ARCHS = {
    # 7 layers: sliding 0-4, full 5 (llama.cpp's pattern of 6), sliding 6; a window of 4 is
    # crossed by every prompt the tests use. head_dim 32 != hidden / heads, as in Gemma 3 270M.
    "gemma3": {
        "config": "Gemma3TextConfig", "model": "Gemma3ForCausalLM", "gguf_arch": gguf.MODEL_ARCH.GEMMA3,
        "layers": 7, "head_dim": 32, "tie": True, "norm_shift": 1.0,
        "config_extra": {"query_pre_attn_scalar": 32, "sliding_window": 4, "rope_theta": 1_000_000.0,
                         "rope_local_base_freq": 10_000.0, "rms_norm_eps": 1e-6,
                         "hidden_activation": "gelu_pytorch_tanh"},
    },
    # q/k/v biases; tied head, as Qwen2.5-0.5B
    "qwen2": {
        "config": "Qwen2Config", "model": "Qwen2ForCausalLM", "gguf_arch": gguf.MODEL_ARCH.QWEN2,
        "layers": 2, "head_dim": HIDDEN // N_HEADS, "tie": True, "norm_shift": 0.0,
        "config_extra": {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "use_sliding_window": False},
    },
    # q/k norms, head_dim 32 != hidden / heads, untied head
    "qwen3": {
        "config": "Qwen3Config", "model": "Qwen3ForCausalLM", "gguf_arch": gguf.MODEL_ARCH.QWEN3,
        "layers": 2, "head_dim": 32, "tie": False, "norm_shift": 0.0,
        "config_extra": {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "attention_bias": False},
    },
}


def arch_config(arch: str, vocab: int, bos_id: int, eos_id: int):
    import transformers

    spec = ARCHS[arch]
    return getattr(transformers, spec["config"])(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=spec["layers"], num_attention_heads=N_HEADS, num_key_value_heads=N_KV_HEADS,
        head_dim=spec["head_dim"], max_position_embeddings=CONTEXT, tie_word_embeddings=spec["tie"],
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=None, **spec["config_extra"],
    )


def arch_weights(model, seed: int, norm_shift: float) -> dict[str, np.ndarray]:
    """Random float32 weights from PCG64(seed) for every parameter, in the model's order.

    Norm gains near 1.0 as the model applies them (Gemma stores gain - 1: norm_shift), biases
    and projections small, the embedding larger (see make_weights)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out = {}
    for name, param in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue  # the embedding itself
        shape = tuple(param.shape)
        if name.endswith("norm.weight"):
            w = 1.0 - norm_shift + 0.05 * rng.standard_normal(shape, dtype=np.float32)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            w = 0.1 * rng.standard_normal(shape, dtype=np.float32)
        else:
            w = 0.05 * rng.standard_normal(shape, dtype=np.float32)
        out[name] = np.ascontiguousarray(w, dtype=np.float32)
    return out


def write_hf_arch(d: Path, model, weights: dict[str, np.ndarray], tok: Tokenizer) -> None:
    """transformers' own checkpoint of `model` holding `weights`, plus the tokenizer files."""
    import torch

    model.load_state_dict({n: torch.from_numpy(w) for n, w in weights.items()},
                          strict=not model.config.tie_word_embeddings)  # (a tied head: the embedding)
    model.save_pretrained(d, safe_serialization=True)
    write_hf_common(d, tok, json.loads((d / "config.json").read_text()))


def gguf_arch_tensors(arch: str, weights: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """HF weights -> [(gguf name, float32 array)] as convert_hf_to_gguf.py yields them."""
    spec = ARCHS[arch]
    names = gguf.get_tensor_name_map(spec["gguf_arch"], spec["layers"])
    out = []
    for hf_name, w in weights.items():
        base, suffix = hf_name.rsplit(".", 1)
        if hf_name.endswith("norm.weight"):
            w = w + np.float32(spec["norm_shift"])
        out.append((f"{names.get_name(base)}.{suffix}", np.ascontiguousarray(w)))
    return out


def quant_plan_arch(name: str, ndim: int) -> QT:
    """model-q.gguf of the other architectures: F32 vectors, F16 attn_v, Q8_0 for the rest."""
    if ndim == 1:
        return QT.F32
    return QT.F16 if name.endswith(".attn_v.weight") else QT.Q8_0


def write_gguf_arch(path: Path, arch: str, tensors, tok: Tokenizer, config, plan, file_type) -> dict[str, str]:
    spec = ARCHS[arch]
    tokens, merges, token_types = tokenizer_tables(tok)
    w = GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[spec["gguf_arch"]])
    w.add_type("model")
    w.add_name(f"slm-tiny-{arch}")
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_freq_base(config.rope_parameters.get("full_attention", config.rope_parameters)["rope_theta"])
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    if getattr(config, "head_dim", None):
        w.add_key_length(config.head_dim)
        w.add_value_length(config.head_dim)
    if getattr(config, "sliding_window", None):  # Gemma 3 (a Qwen config holds None here)
        w.add_sliding_window(config.sliding_window)
    w.add_file_type(int(file_type))
    w.add_vocab_size(config.vocab_size)
    return write_tokenizer_and_tensors(w, tokens, token_types, merges, tensors, plan)


def make_tiny_arch_model(outdir: Path, arch: str, seed: int = 0) -> dict:
    """hf/, model.gguf (F32) and model-q.gguf (F32/F16/Q8_0) of a tiny `arch` model."""
    import torch
    import transformers

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    vocab = tok.get_vocab_size()
    bos_id, eos_id = tok.token_to_id(BOS_TOKEN), tok.token_to_id(EOS_TOKEN)
    config = arch_config(arch, vocab, bos_id, eos_id)
    torch.manual_seed(seed)  # transformers' initial draw, all of it then overwritten
    model = getattr(transformers, ARCHS[arch]["model"])(config)
    weights = arch_weights(model, seed, ARCHS[arch]["norm_shift"])
    hf_dir = outdir / "hf"
    write_hf_arch(hf_dir, model, weights, tok)
    tensors = gguf_arch_tensors(arch, weights)
    paths = {"gguf": outdir / "model.gguf", "gguf_q": outdir / "model-q.gguf"}
    types = {
        "gguf": write_gguf_arch(paths["gguf"], arch, tensors, tok, config, lambda n, d: QT.F32,
                                LlamaFileType.ALL_F32),
        "gguf_q": write_gguf_arch(paths["gguf_q"], arch, tensors, tok, config, quant_plan_arch,
                                  LlamaFileType.MOSTLY_Q8_0),
    }
    return {"outdir": outdir, "hf": hf_dir, **paths, "arch": arch, "vocab_size": vocab,
            "bos_token_id": bos_id, "eos_token_id": eos_id, "gguf_types": types}
