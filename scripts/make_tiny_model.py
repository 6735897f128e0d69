#!/usr/bin/env python3
"""Write a tiny synthetic model, deterministically, as HF checkpoints and as GGUF files.

    python scripts/make_tiny_model.py OUTDIR [--seed 0] [--arch llama|gemma3|qwen2|qwen3]

The default is a Llama; the other architectures are scripts/tiny_arch.py's (ARCHS), and what
every family's fixture shares (shape, tokenizer, file writers) is scripts/tiny_common.py's.

Layout written under OUTDIR (same bytes on every run for the same seed; nothing time-dependent):

    hf/                       single-file Hugging Face checkpoint (config, safetensors, tokenizer)
    hf-sharded/               the same weights split over two safetensors files + index.json
    model.gguf                every tensor F32
    model-q.gguf              F32 norms + a mix of F16, BF16, Q8_0, Q4_0, Q4_1 weight matrices
    model-unsupported.gguf    like model.gguf, but one tensor is MXFP4 (a type slm does not read)

The GGUF files are laid out the way llama.cpp's convert_hf_to_gguf.py writes a Llama with a
GPT-2-style byte-level BPE vocabulary (as SmolLM2 is), including the q/k row permutation.
The GGUF files sit at the top of OUTDIR, away from hf/, so that
`from_pretrained(OUTDIR, gguf_file=...)` cannot pick up a stray config.json/tokenizer.json.

This is a standalone fixture tool: it must not import `slm` (it produces the reference the
package is tested against). Needs numpy, safetensors, tokenizers and gguf.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, LlamaFileType
from tiny_arch import ARCHS, make_tiny_arch_model
from tiny_common import (BOS_TOKEN, CONTEXT, EOS_TOKEN, HEAD_DIM, HIDDEN, INTERMEDIATE, N_HEADS, N_KV_HEADS, N_LAYERS,
                         RMS_EPS, ROPE_THETA, build_tokenizer, tokenizer_tables, write_hf_common, write_json,
                         write_tokenizer_and_tensors)
from tokenizers import Tokenizer

MODEL_NAME = "slm-tiny-llama"  # must not contain "mistral": transformers renames the arch then


# --------------------------------------------------------------------------------------------
# Weights (HF names and layout: Linear weights are [out_features, in_features])
# --------------------------------------------------------------------------------------------
def hf_tensor_shapes(vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the model in a fixed order; the RNG draws in this order."""
    q_out, kv_out = N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM
    shapes = [("model.embed_tokens.weight", (vocab, HIDDEN))]
    for i in range(N_LAYERS):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "self_attn.q_proj.weight", (q_out, HIDDEN)),
            (p + "self_attn.k_proj.weight", (kv_out, HIDDEN)),
            (p + "self_attn.v_proj.weight", (kv_out, HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, q_out)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
            (p + "mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN)),
            (p + "mlp.up_proj.weight", (INTERMEDIATE, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, INTERMEDIATE)),
        ]
    shapes += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (vocab, HIDDEN))]
    return shapes


def make_weights(seed: int, vocab: int) -> dict[str, np.ndarray]:
    """Random float32 weights from PCG64(seed).

    Small normal weights keep activations tame through two layers, and norm gains near 1.0 keep
    RMSNorm meaningful. Embedding and lm_head get a larger std so the logits (about
    N(0, 0.8) after the final norm) are far from flat and argmax is well defined.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    weights = {}
    for name, shape in hf_tensor_shapes(vocab):
        if name.endswith("norm.weight"):
            w = 1.0 + 0.05 * rng.standard_normal(shape, dtype=np.float32)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            w = 0.1 * rng.standard_normal(shape, dtype=np.float32)
        else:
            w = 0.05 * rng.standard_normal(shape, dtype=np.float32)
        weights[name] = np.ascontiguousarray(w, dtype=np.float32)
    return weights


# --------------------------------------------------------------------------------------------
# Hugging Face checkpoint
# --------------------------------------------------------------------------------------------
def hf_config(vocab: int, bos_id: int, eos_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": N_LAYERS,
        "num_attention_heads": N_HEADS,
        "num_key_value_heads": N_KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": vocab,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def write_hf(d: Path, weights: dict[str, np.ndarray], tok: Tokenizer, config: dict) -> None:
    write_hf_common(d, tok, config)
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})


def write_hf_sharded(d: Path, weights: dict[str, np.ndarray], tok: Tokenizer, config: dict) -> None:
    """Same weights over two files: embeddings + layer 0 in the first, the rest in the second.

    Splitting at a layer boundary is what HF's own sharding tends to do, and it leaves one layer
    whose tensors all live in the second shard.
    """
    write_hf_common(d, tok, config)
    names = [n for n, _ in hf_tensor_shapes(weights["lm_head.weight"].shape[0])]
    first = [n for n in names if n == "model.embed_tokens.weight" or n.startswith("model.layers.0.")]
    shards = [first, [n for n in names if n not in first]]
    weight_map = {}
    for k, shard in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: weights[n] for n in shard}, str(d / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in shard})
    total = int(sum(w.nbytes for w in weights.values()))
    write_json(d / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


# --------------------------------------------------------------------------------------------
# GGUF
# --------------------------------------------------------------------------------------------
def permute_for_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: reorder q/k rows from HF's rotate-half RoPE layout
    (the two halves of each head's dims) to GGML's interleaved pairs (2i, 2i+1).

    A runtime reading the GGUF applies RoPE to adjacent pairs; transformers' GGUF loader undoes
    this with reshape(n_head, dim, 2, ...).swapaxes(1, 2).
    """
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# HF suffix within a layer -> GGUF tensor name suffix (gguf-py's tensor_mapping for LLAMA).
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_tensors(weights: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """HF weights -> [(gguf name, float32 array)], in file order, with q/k permuted.

    The arrays keep numpy (row-major, [out, in]) shape; GGUFWriter reverses it into GGML's
    ne = [in, out], exactly as the converter does.
    """
    out = [("token_embd.weight", weights["model.embed_tokens.weight"])]
    for i in range(N_LAYERS):
        for hf_suffix, gg_suffix in LAYER_NAMES.items():
            w = weights[f"model.layers.{i}.{hf_suffix}.weight"]
            if gg_suffix == "attn_q":
                w = permute_for_gguf(w, N_HEADS)
            elif gg_suffix == "attn_k":
                w = permute_for_gguf(w, N_KV_HEADS)
            out.append((f"blk.{i}.{gg_suffix}.weight", np.ascontiguousarray(w)))
    out += [("output_norm.weight", weights["model.norm.weight"]), ("output.weight", weights["lm_head.weight"])]
    return out


def quant_plan_mixed(name: str, ndim: int) -> QT:
    """model-q.gguf: one file that holds every type a minimal reader has to support."""
    if ndim == 1:
        return QT.F32  # norms stay F32, as llama.cpp always keeps 1-D tensors
    if name == "token_embd.weight":
        return QT.Q8_0
    if name == "output.weight":
        return QT.BF16
    if name.endswith(".attn_v.weight"):
        return QT.F16
    if name.endswith(".ffn_down.weight"):
        return QT.Q4_0
    return QT.Q4_1  # attn_q, attn_k, attn_output, ffn_gate, ffn_up


UNSUPPORTED_TENSOR = "blk.1.ffn_up.weight"
UNSUPPORTED_TYPE = QT.MXFP4


def quant_plan_unsupported(name: str, ndim: int) -> QT:
    """model-unsupported.gguf: all F32 except one matrix in MXFP4.

    MXFP4 is a real llama.cpp type that gguf-py can quantize (32-value blocks, so it fits rows
    of 64 or 128) and that slm does not read.
    It sits in the last layer so a lazy reader meets it only after many supported tensors.
    """
    return UNSUPPORTED_TYPE if name == UNSUPPORTED_TENSOR else QT.F32


def write_gguf(path: Path, tensors, tok: Tokenizer, vocab: int, plan, file_type: LlamaFileType) -> dict[str, str]:
    """Write one GGUF; return {tensor name: type name} as written."""
    tokens, merges, token_types = tokenizer_tables(tok)
    w = GGUFWriter(str(path), "llama")  # adds general.architecture = "llama"
    w.add_type("model")
    w.add_name(MODEL_NAME)
    # Hyperparameters, in the order convert_hf_to_gguf.py's TextModel/LlamaModel emit them.
    w.add_block_count(N_LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTERMEDIATE)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_KV_HEADS)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_key_length(HEAD_DIM)  # written by the converter whenever config.json has head_dim
    w.add_value_length(HEAD_DIM)
    w.add_file_type(int(file_type))
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(HEAD_DIM)
    return write_tokenizer_and_tensors(w, tokens, token_types, merges, tensors, plan)


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------
def make_tiny_model(outdir: Path, seed: int = 0, arch: str = "llama") -> dict:
    """Generate everything under outdir; return the paths (and the GGUF type layout)."""
    if arch != "llama":
        return make_tiny_arch_model(outdir, arch, seed)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)

    tok = build_tokenizer()
    vocab = tok.get_vocab_size()  # includes the special tokens
    bos_id, eos_id = tok.token_to_id(BOS_TOKEN), tok.token_to_id(EOS_TOKEN)
    config = hf_config(vocab, bos_id, eos_id)
    weights = make_weights(seed, vocab)

    hf_dir, sharded_dir = outdir / "hf", outdir / "hf-sharded"
    write_hf(hf_dir, weights, tok, config)
    write_hf_sharded(sharded_dir, weights, tok, config)

    tensors = gguf_tensors(weights)
    paths = {
        "gguf": outdir / "model.gguf",
        "gguf_q": outdir / "model-q.gguf",
        "gguf_unsupported": outdir / "model-unsupported.gguf",
    }
    types = {
        "gguf": write_gguf(paths["gguf"], tensors, tok, vocab, lambda n, d: QT.F32, LlamaFileType.ALL_F32),
        "gguf_q": write_gguf(paths["gguf_q"], tensors, tok, vocab, quant_plan_mixed, LlamaFileType.MOSTLY_Q4_1),
        # file_type stays ALL_F32: llama-quantize keeps the base ftype when one tensor is overridden.
        "gguf_unsupported": write_gguf(
            paths["gguf_unsupported"], tensors, tok, vocab, quant_plan_unsupported, LlamaFileType.ALL_F32
        ),
    }
    return {
        "outdir": outdir,
        "hf": hf_dir,
        "hf_sharded": sharded_dir,
        **paths,
        "vocab_size": vocab,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "gguf_types": types,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", choices=["llama", *ARCHS], default="llama")
    args = ap.parse_args(argv)
    result = make_tiny_model(args.outdir, seed=args.seed, arch=args.arch)
    for path in sorted(p for p in args.outdir.rglob("*") if p.is_file()):
        print(f"{path.stat().st_size:>9}  {path.relative_to(args.outdir)}")
    print(f"vocab_size={result['vocab_size']} bos={result['bos_token_id']} eos={result['eos_token_id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
