"""The real Gemma 3 270M Q4_K_M GGUF: its metadata read into a gemma3 description, then the
imported base (slm's codecs and fused kernels on its Q4_K, Q5_0, Q6_K, Q8_0 and F32 bytes)
against transformers on the same file (gguf-py dequantizes it to float32) and against the
float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import exact
from slm.formats import llama as names
from slm.formats.gguf import read_gguf
from slm.formats.gguf_model import architecture_from_gguf, supported_nbytes

pytestmark = [pytest.mark.real_model, pytest.mark.oracle]


@pytest.fixture(scope="module")
def arch(gemma_gguf) -> dict:
    with read_gguf(gemma_gguf, supported_nbytes) as g:
        a = architecture_from_gguf(g)
        names.check_tensors(a, {t.name: t.shape for t in g.tensors}, g.path.name)  # all 236, named as expected
        assert a["vocab_size"] == next(t.shape[0] for t in g.tensors if t.name == "token_embd.weight")
    return a


def test_metadata_reads_into_a_gemma3_description(arch, gemma_gguf):
    """Against transformers' own reading of the same file (its GGUF config mapping, then
    Gemma3TextConfig's defaults for what the file does not say, as llama.cpp hard-codes them)."""
    from transformers import Gemma3TextConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parsed = load_gguf_checkpoint(str(gemma_gguf), return_tensors=False)["config"]
    config = Gemma3TextConfig(**{k: v for k, v in parsed.items() if k not in ("model_type", "architectures")})
    assert arch["family"] == "gemma3"
    for ours, theirs in [("hidden_size", "hidden_size"), ("intermediate_size", "intermediate_size"),
                         ("num_layers", "num_hidden_layers"), ("num_heads", "num_attention_heads"),
                         ("num_kv_heads", "num_key_value_heads"), ("head_dim", "head_dim"),
                         ("context_length", "max_position_embeddings"), ("sliding_window", "sliding_window"),
                         ("tie_word_embeddings", "tie_word_embeddings"), ("layer_types", "layer_types"),
                         ("query_pre_attn_scalar", "query_pre_attn_scalar")]:
        assert arch[ours] == getattr(config, theirs), ours
    assert arch["rms_norm_eps"] == pytest.approx(config.rms_norm_eps, rel=1e-6)
    assert arch["rope_theta"] == config.rope_parameters["full_attention"]["rope_theta"]
    assert arch["rope_theta_local"] == config.rope_parameters["sliding_attention"]["rope_theta"]
    assert arch["final_logit_softcap"] == 0.0 and config.final_logit_softcapping is None
    assert arch["layer_types"].count("full_attention") == 3  # layers 5, 11, 17


@pytest.fixture(scope="module")
def store(gemma_gguf, tmp_path_factory):
    from slm.ops.store.importing import import_base
    from slm.store import init_store

    store, _ = init_store(tmp_path_factory.mktemp("gemma") / "store")
    import_base(store, gemma_gguf, "gemma")
    return store


@pytest.fixture(scope="module")
def transformers_model(gemma_transformers):
    return gemma_transformers  # tests/conftest.py: loaded once, shared with tests/real/test_gemma_real.py


def test_import_greedy_text_and_verify(store, arch, transformers_model):
    """The imported base's description is the file's; greedy decoding gives transformers'
    tokens; `slm verify` passes (integrity and numerics against the float64 oracle)."""
    import torch

    from slm.engine.generate import generate
    from slm.engine.sampling import Sampler
    from slm.ops.infer.loading import load_base_model
    from slm.ops.infer.verify import verify

    loaded = load_base_model(store, "gemma")
    assert loaded.staged.base.architecture == arch and loaded.staged.base.qk_row_layout == "hf"
    prompt = loaded.tokenizer.encode("The capital of France is")  # <bos> included (add_bos_token)
    assert prompt[0] == 2
    ours = generate(exact(loaded.model), prompt, 24, Sampler(), frozenset()).ids
    with torch.no_grad():
        theirs = transformers_model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
    assert ours == theirs[0, len(prompt):].tolist()
    print("gemma-3-270m greedy:", repr(loaded.tokenizer.decode(ours)))
    report = verify(store, "gemma")
    assert report.ok and report.numerics is not None, report


@pytest.mark.slow
def test_quantized_weights_agree_with_transformers(store, transformers_model):
    """600 positions, so the 512-wide sliding windows cut in; decoding past the window (the KV
    rings wrap) against the one-shot prefill; the float64 oracle on the first 41 positions.
    Prints the differences."""
    import torch

    from slm.model.oracle import Oracle
    from slm.ops.infer.loading import load_base_model

    ids = [2] + np.random.default_rng(0).integers(3, 262_000, 599).tolist()
    loaded = load_base_model(store, "gemma")
    ours = exact(loaded.model)  # the float32 promise: within 1e-3 of transformers
    logits = ours.forward(np.asarray(ids), ours.new_cache(len(ids)), "all")
    cache = ours.new_cache(len(ids))
    ours.forward(np.asarray(ids[:520]), cache)
    decoded = np.stack([ours.forward(np.asarray([i]), cache)[0] for i in ids[520:]])
    base = loaded.staged.base
    oracle = Oracle(base.architecture, base.qk_row_layout, ours.t).logits(ids[:41])  # (causal: a prefix)
    with torch.no_grad():
        ref = transformers_model(torch.tensor([ids])).logits[0].numpy()
    diff = np.abs(logits - ref)
    top1 = np.mean(logits.argmax(-1) == ref.argmax(-1))
    print(f"gemma-3-270m Q4_K_M: max abs logit difference {diff.max():.3g} (logits std {ref.std():.3g}), "
          f"mean {diff.mean():.3g}, top-1 agreement {top1:.4f}; decode vs prefill "
          f"{np.abs(decoded - logits[520:]).max():.3g}; float64 oracle {np.abs(oracle - ref[:41]).max():.3g}")
    assert top1 > 0.99
    assert diff.max() < 5e-3  # measured 1.0e-3 (logits std 11.5): float32 summation order
    assert np.abs(decoded - logits[520:]).max() < 5e-3  # measured 8.3e-4
    assert np.abs(oracle - ref[:41]).max() < 5e-4  # measured 9.9e-5 (gguf-py's dequantization)
