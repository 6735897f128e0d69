#!/usr/bin/env python3
"""Write a tiny synthetic model, deterministically, as HF checkpoints and as GGUF files.

    python scripts/make_tiny_model.py OUTDIR [--seed 0] [--arch llama|gemma3|qwen2|qwen3]

The default is a Llama; the other architectures are described after the Llama part (ARCHS).

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
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, LlamaFileType, TokenType
from gguf.quants import quantize
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# --------------------------------------------------------------------------------------------
# Model shape. head_dim * num_attention_heads == hidden_size; num_key_value_heads < heads so
# grouped-query attention is exercised. Every row length (64, 128) is a multiple of 32, the
# block size of Q4_0/Q4_1/Q5_0/Q8_0, so every matrix can be quantized.
# --------------------------------------------------------------------------------------------
HIDDEN = 64
INTERMEDIATE = 128
N_LAYERS = 2
N_HEADS = 4
N_KV_HEADS = 2
HEAD_DIM = 16
CONTEXT = 256
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
TARGET_VOCAB = 400
MODEL_NAME = "slm-tiny-llama"  # must not contain "mistral": transformers renames the arch then

# Token order matters: BpeTrainer gives special tokens the first ids, in this order.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_TOKEN = "<|im_start|>"  # as in SmolLM2-Instruct: bos=<|im_start|>, eos=<|im_end|>
EOS_TOKEN = "<|im_end|>"

# ChatML, the template SmolLM2-Instruct uses (minus its default system prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Training text for the tokenizer. Digits, punctuation, newlines, runs of spaces and some
# multi-byte UTF-8 are in here so the merges and the byte-level alphabet get exercised.
CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs into the woods.
A small cat sat on the mat. The cat looked at the bird in the tree, and the bird sang a song for the cat.
Hello world! Hello there, world. The world says hello back to the cat that sat on the mat.

Once upon a time there was a little town by the sea. The people of the town went fishing every morning,
and in the evening they sat together and told stories about the ships that sailed past the harbor.
The children of the town liked the stories about the sea more than anything else in the world.

This is a tiny model made for tests. It has two layers, four heads, and a small vocabulary.
Numbers like 1, 2, 3, 10, 42, 256 and 2024 appear in text too, as do questions: what is the time?
Where is the cat? Why did the dog run? How many ships are in the harbor today? There are 12.

The user asks a question and the assistant answers it. The assistant is helpful, honest and brief.
When the weather is cold, the children wear warm coats; when it is hot, they play in the water.
    Indented lines keep    several spaces, and tabs\tappear\ttoo.
Some words come from other languages: café, naïve, façade, Zürich, smörgåsbord, and the symbol —.
"""


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------
def build_tokenizer() -> Tokenizer:
    """Train a GPT-2 style byte-level BPE on CORPUS.

    ByteLevel(add_prefix_space=False) with its default use_regex=True splits text with the GPT-2
    regex, which is what llama.cpp's pre-tokenizer "gpt-2" implements. BpeTrainer is
    deterministic here: counts do not depend on hashing, ties are broken by pair id and the
    initial alphabet is sorted; the test regenerates to prove it.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.split("\n\n"), trainer=trainer)
    return tok


def tokenizer_tables(tok: Tokenizer) -> tuple[list[str], list[str], list[int]]:
    """(tokens by id, merges as "a b" strings, llama.cpp token types) for the GGUF vocab.

    Read from the serialized tokenizer.json so the GGUF holds exactly what hf/ holds.
    """
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for text, idx in vocab.items():
        tokens[idx] = text
    assert all(t is not None for t in tokens), "vocab ids are not contiguous"
    # tokenizers >= 0.20 serializes merges as [a, b] pairs, older versions as "a b" strings.
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    # Like convert_hf_to_gguf.py's get_vocab_base: special added tokens are CONTROL, rest NORMAL.
    types = [int(TokenType.CONTROL if t in special else TokenType.NORMAL) for t in tokens]
    return tokens, merges, types


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
def write_json(path: Path, obj) -> None:
    # sort_keys + fixed indent + trailing newline: byte-stable across runs and Python versions.
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


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


def write_hf_common(d: Path, tok: Tokenizer, config: dict) -> None:
    """Everything in an HF dir except the weights."""
    d.mkdir(parents=True, exist_ok=True)
    write_json(d / "config.json", config)
    write_json(
        d / "generation_config.json",
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"], "do_sample": False},
    )
    tok.save(str(d / "tokenizer.json"), pretty=True)
    write_json(
        d / "tokenizer_config.json",
        {
            "tokenizer_class": "GPT2Tokenizer",
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "unk_token": SPECIAL_TOKENS[0],
            # Nothing is added around the text: the chat template writes the markers itself.
            "add_bos_token": False,
            "add_eos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": CONTEXT,
            "chat_template": CHAT_TEMPLATE,
        },
    )


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


def encode_tensor(arr: np.ndarray, qtype: QT) -> tuple[np.ndarray, QT | None]:
    """(data, raw_dtype) for GGUFWriter.add_tensor.

    F32/F16 are passed as float arrays (the writer infers the type); everything else is the
    uint8 block bytes from gguf.quants with raw_dtype set, from which the writer recovers the
    element shape.
    """
    if qtype == QT.F32:
        return arr.astype(np.float32), None
    if qtype == QT.F16:
        return arr.astype(np.float16), None
    return quantize(arr, qtype), qtype


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


def write_tokenizer_and_tensors(w, tokens, token_types, merges, tensors, plan) -> dict:
    """The tokenizer keys, the tensors (typed by plan(name, ndim)) and the file itself; returns
    {tensor name: type name}. Shared by every family's fixture writer.

    Tokenizer: model "gpt2" = byte-level BPE. pre "gpt-2" (with the hyphen: the string llama.cpp's
    llama-vocab.cpp matches) selects the plain GPT-2 split regex, the one ByteLevel(use_regex=True)
    applies. "smollm" would additionally split every digit apart, which this tokenizer does not do.
    """
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index(BOS_TOKEN))
    w.add_eos_token_id(tokens.index(EOS_TOKEN))
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    written = {}
    for name, arr in tensors:
        qtype = plan(name, arr.ndim)
        data, raw_dtype = encode_tensor(arr, qtype)
        w.add_tensor(name, data, raw_dtype=raw_dtype)
        written[name] = qtype.name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


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
