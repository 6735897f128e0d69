"""The decode step in one native call (slm.model.step_native, slm_decode_step) against the
op-by-op path (Decoder.block over NativeKernels), which the kernel tests check against the
float64 references.

The step promises the same arithmetic, so the promise is tested bit for bit: synthetic models
of every family (Llama with GGUF row order, Gemma 3 with GeGLU, post-norms, a query scale,
sliding windows that wrap, a softcapped tied head; Qwen2 with q/k/v biases; Qwen3 with q/k
norms), every linear layer of one block type the C kernels have, with and without LoRA
overlays (two adapters on one layer: concatenated ranks), decoded for longer than the window.
Then batches: rows on different compositions through the batched step equal their single runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import random_overlay

from slm import arch as archs
from slm.model import kernels_native
from slm.model.decoder import Config, Decoder
from slm.model.weights import quant_tensor

pytestmark = pytest.mark.skipif(not kernels_native.available(), reason="C kernels not built")

gguf = pytest.importorskip("gguf")
from test_kernels_kquants import TYPES, blocks, tensor  # noqa: E402

HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB = 256, 512, 4, 2, 64, 3, 320
WINDOW = 4  # Gemma's sliding layers: the 6-token prompt and 10 steps wrap the ring


def _config(family: str) -> Config:
    gemma = family == "gemma3"
    return Config(
        desc=archs.get(family), vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_layers=LAYERS,
        num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, context_length=64, rms_norm_eps=1e-6,
        rope_theta=1e6 if gemma else 1e4, tie_word_embeddings=gemma,
        sliding_window=WINDOW if gemma else 0,
        layer_types=("sliding_attention", "full_attention", "sliding_attention") if gemma else ("full_attention",) * LAYERS,
        rope_theta_local=1e4, query_pre_attn_scalar=48.0 if gemma else float(HEAD_DIM),
        final_logit_softcap=30.0 if gemma else 0.0, qk_row_layout="gguf" if family == "llama" else "hf")


def _vector(name: str, values: np.ndarray):
    return quant_tensor(name, values.shape, "f32", values.astype(np.float32).tobytes())


def _model(family: str, ggml_type, seed: int) -> Decoder:
    """Random weights: every linear layer of ggml_type (non-adversarial blocks: sane scales),
    the embedding Q8_0, norms near 1, biases where the family has them."""
    cfg = _config(family)
    rng = np.random.default_rng(seed)
    shapes = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
              "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM),
              "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    t = {"token_embd.weight": tensor(gguf.GGMLQuantizationType.Q8_0,
                                     blocks(gguf.GGMLQuantizationType.Q8_0, VOCAB, HIDDEN, seed, adversarial=False)),
         "output_norm.weight": _vector("output_norm.weight", 1 + 0.1 * rng.standard_normal(HIDDEN))}
    if not cfg.tie_word_embeddings:
        t["output.weight"] = tensor(gguf.GGMLQuantizationType.Q8_0,
                                    blocks(gguf.GGMLQuantizationType.Q8_0, VOCAB, HIDDEN, seed + 1, adversarial=False))
    desc = cfg.desc
    norms = {"attn_norm": HIDDEN, "ffn_norm": HIDDEN}
    if desc.qk_norm:
        norms |= {"attn_q_norm": HEAD_DIM, "attn_k_norm": HEAD_DIM}
    if desc.post_norms:
        norms |= {"post_attention_norm": HIDDEN, "post_ffw_norm": HIDDEN}
    for i in range(LAYERS):
        for j, (role, (rows, cols)) in enumerate(shapes.items()):
            raw = blocks(ggml_type, rows, cols, seed=seed * 100 + i * 10 + j, adversarial=False)
            t[f"blk.{i}.{role}.weight"] = tensor(ggml_type, raw)
        for role, n in norms.items():
            t[f"blk.{i}.{role}.weight"] = _vector(role, 1 + 0.1 * rng.standard_normal(n))
        if desc.qkv_bias:
            for role in ("attn_q", "attn_k", "attn_v"):
                n = shapes[role][0]
                t[f"blk.{i}.{role}.bias"] = _vector(role, 0.1 * rng.standard_normal(n))
    return Decoder(cfg, t)


def _compositions(base: Decoder, seed: int) -> list[Decoder]:
    """The base alone, one LoRA on every linear layer, and two LoRAs (the second on attention)."""
    rng = np.random.default_rng(seed)
    linear = [n for n, w in base.t.items() if len(w.shape) == 2 and n.startswith("blk.")]
    attn = [n for n in linear if ".attn_" in n]
    return [Decoder(base.cfg, base.t, overlays=o) for o in
            ([], [random_overlay("lora", base, rng, linear)],
             [random_overlay("lora", base, rng, linear), random_overlay("lora", base, rng, attn, 0.5)])]


def _decode(model: Decoder, prompt: np.ndarray, steps: int) -> list[np.ndarray]:
    """Prefill, then greedy steps one token at a time: the logits of every step."""
    cache = model.new_cache(len(prompt) + steps)
    out = [model.forward(prompt, cache, "last")[-1]]
    for _ in range(steps):
        out.append(model.forward(np.asarray([int(np.argmax(out[-1]))]), cache, "last")[-1])
    return out


FAMILIES = ["llama", "gemma3", "qwen2", "qwen3"]
BLOCK_TYPES = [*TYPES, "nf4"]


def _types_for(family: str) -> list:
    return BLOCK_TYPES if family == "llama" else [gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q8_0]


def _nf4_model(family: str, seed: int) -> Decoder:
    """NF4 (slm's own type, no GGML id): the same model with its linear layers quantized by slm."""
    from slm import quant

    model = _model(family, gguf.GGMLQuantizationType.Q8_0, seed)
    codec = quant.get_codec("nf4")
    t = dict(model.t)
    for name, w in model.t.items():
        if name.startswith("blk.") and len(w.shape) == 2:
            t[name] = quant_tensor(name, w.shape, "nf4", codec.quantize(w.dequantize()).tobytes())
    return Decoder(model.cfg, t)


@pytest.mark.parametrize("family,ggml_type", [(f, g) for f in FAMILIES for g in _types_for(f)],
                         ids=lambda v: getattr(v, "name", v))
def test_native_step_is_the_op_path_bit_for_bit(family, ggml_type, monkeypatch):
    from slm.model.step_native import NativeStep

    seed = FAMILIES.index(family) + 1
    base = _nf4_model(family, seed) if ggml_type == "nf4" else _model(family, ggml_type, seed)
    prompt = np.random.default_rng(seed).integers(0, VOCAB, 6)
    models = _compositions(base, seed)
    assert all(m.native_step() is not None for m in models)  # the step under test is taken
    native = [_decode(m, prompt, steps=10) for m in models]
    monkeypatch.setattr(NativeStep, "for_model", classmethod(lambda cls, model: None))
    op_path = [_decode(m, prompt, steps=10) for m in _compositions(base, seed)]
    for c, (got, want) in enumerate(zip(native, op_path)):
        assert all(np.isfinite(g).all() for g in got)
        for s, (g, w) in enumerate(zip(got, want)):
            assert g.tobytes() == w.tobytes(), f"composition {c}, step {s}: {np.abs(g - w).max()}"
    assert native[0][-1].tobytes() != native[1][-1].tobytes()  # the LoRA changed the answer


@pytest.mark.parametrize("family", FAMILIES)
def test_native_batch_rows_equal_their_single_runs(family):
    """Five rows on three compositions and an IA3 one (which the native step declines: it runs
    op by op beside them), different prompt lengths, through the batched step."""
    from test_batch import _check_rows_equal_single_runs

    base = _model(family, gguf.GGMLQuantizationType.Q4_K, seed=7)
    rng = np.random.default_rng(3)
    comps = _compositions(base, seed=3)
    v = [n for n in base.t if n.endswith("attn_v.weight")]
    ia3 = Decoder(base.cfg, base.t, overlays=[random_overlay("ia3", base, rng, v)])
    assert ia3.native_step() is None and all(c.native_step() is not None for c in comps)
    models = [comps[0], comps[1], ia3, comps[2], comps[1]]
    prompts = [rng.integers(0, VOCAB, n) for n in (2, 6, 3, 9, 5)]
    _check_rows_equal_single_runs(models, prompts, steps=6)


def test_native_step_declines_what_it_lacks(tiny_model, store):
    """A weight type without a C kernel (the tiny model's F16 attn_v) or an overlay applied
    after the kernel (IA3, sparse) takes the op path."""
    from slm.ops.store.importing import import_base
    from slm.ops.infer.loading import load_base_model

    import_base(store, tiny_model["gguf_q"], "tq")
    assert load_base_model(store, "tq").model.native_step() is None  # F16 attn_v
    base = _model("llama", gguf.GGMLQuantizationType.Q8_0, seed=2)
    rng = np.random.default_rng(2)
    q = [n for n in base.t if n.endswith("attn_q.weight")]
    for kind in ("ia3", "sparse"):
        assert Decoder(base.cfg, base.t, overlays=[random_overlay(kind, base, rng, q)]).native_step() is None
    f16 = base.t["blk.1.ffn_up.weight"]
    t = dict(base.t, **{"blk.1.ffn_up.weight": quant_tensor(
        "blk.1.ffn_up.weight", f16.shape, "f16", f16.dequantize().astype(np.float16).tobytes())})
    assert Decoder(base.cfg, t).native_step() is None


# --------------------------------------------------------- int8 activations (the default mode)

INT8_TYPES = [gguf.GGMLQuantizationType[t] for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")]


def _int8(models: list[Decoder]) -> list[Decoder]:
    for m in models:
        m.kernels.set_activations("int8")
    return models


@pytest.mark.parametrize("family,ggml_type", [("llama", t) for t in INT8_TYPES] +
                         [(f, gguf.GGMLQuantizationType.Q8_0) for f in FAMILIES[1:]],
                         ids=lambda v: getattr(v, "name", v))
def test_int8_step_is_the_int8_op_path_bit_for_bit(family, ggml_type, monkeypatch):
    """The int8 activations (the default mode) keep the step's promise (the same arithmetic as the op
    path, bit for bit); they move the logits, by a bounded amount. (The K types' products mix
    with the Q8_0 head's in the same mode.)"""
    from slm.model.step_native import NativeStep

    seed = FAMILIES.index(family) + 11
    base = _model(family, ggml_type, seed)
    prompt = np.random.default_rng(seed).integers(0, VOCAB, 6)
    floats = [_decode(m, prompt, steps=8) for m in _compositions(base, seed)]
    native = [_decode(m, prompt, steps=8) for m in _int8(_compositions(base, seed))]
    monkeypatch.setattr(NativeStep, "for_model", classmethod(lambda cls, model: None))
    op_path = [_decode(m, prompt, steps=8) for m in _int8(_compositions(base, seed))]
    for c, (got, want, f) in enumerate(zip(native, op_path, floats)):
        for s, (g, w) in enumerate(zip(got, want)):
            assert g.tobytes() == w.tobytes(), f"composition {c}, step {s}: {np.abs(g - w).max()}"
        # the first step (same tokens in both modes): int8 moves the logits, boundedly (random
        # weights and inputs, three layers: up to ~15% of the largest logit here; the real
        # bases move far less, docs/numerics.md)
        moved = np.abs(got[0] - f[0]).max() / np.abs(f[0]).max()
        assert 0.0 < moved < 0.3, moved


@pytest.mark.parametrize("family,type_name", [("llama", "Q5_0"), ("llama", "Q4_0"), ("gemma3", "Q8_0")])
def test_int8_batch_rows_equal_their_single_runs(family, type_name):
    """(Q4_0: the rows packed eight at a time, qkernels/rows_q4x8.c)"""
    from test_batch import _check_rows_equal_single_runs

    base = _model(family, gguf.GGMLQuantizationType[type_name], seed=17)
    rng = np.random.default_rng(5)
    comps = _int8(_compositions(base, seed=5))
    models = [comps[0], comps[1], comps[2], comps[1]]
    prompts = [rng.integers(0, VOCAB, n) for n in (2, 6, 3, 5)]
    _check_rows_equal_single_runs(models, prompts, steps=5, mode="int8")
