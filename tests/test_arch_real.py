"""The real Gemma 3 270M Q4_K_M GGUF: its metadata read into a gemma3 description, and (its
k-quants dequantized by gguf-py, test-only) slm's executor against transformers on its weights.

Its Q4_K / Q5_0 / Q6_K codecs and SentencePiece tokenizer are not on this branch, so it cannot be
imported whole here; everything the architecture decides is checked.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from slm.formats import llama as names
from slm.formats.gguf import read_gguf
from slm.formats.gguf_model import architecture_from_gguf, supported_nbytes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import gemma3_path  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.oracle]


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    os.environ.setdefault(gemma3_path.CACHE_ENV, "/work/.modelcache")
    path = gemma3_path.locate()
    if path is None:
        pytest.fail("the Gemma 3 270M chunk packages are not installed (scripts/gemma3_path.py)")
    return path


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


def _dequantized_model(path: Path, arch: dict):
    """slm's executor over every tensor of the file dequantized to F32 by gguf-py."""
    import gguf

    from slm.model.decoder import Config, Decoder
    from slm.model.kernels import ReferenceKernels
    from slm.model.weights import quant_tensor

    tensors = {}
    for t in gguf.GGUFReader(path).tensors:
        values = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        shape = tuple(int(d) for d in reversed(t.shape))  # GGML ne -> NumPy order
        tensors[t.name] = quant_tensor(t.name, shape, "f32", values.reshape(shape).tobytes())
    return Decoder(Config.from_architecture(arch, "hf"), tensors, kernels=ReferenceKernels())


@pytest.mark.slow
def test_dequantized_weights_agree_with_transformers(arch, gemma_gguf):
    """600 positions, so the 512-wide sliding windows cut in; prints the max abs difference.
    The float64 oracle on the first 41 positions too."""
    import torch
    from transformers import AutoModelForCausalLM

    from slm.model.oracle import Oracle

    ids = [2] + np.random.default_rng(0).integers(3, 262_000, 599).tolist()
    ours = _dequantized_model(gemma_gguf, arch)
    logits = ours.forward(np.asarray(ids), ours.new_cache(len(ids)), "all")
    oracle = Oracle(arch, "hf", ours.t).logits(ids[:41])  # float64: a short prefix (causal)
    del ours
    hf = AutoModelForCausalLM.from_pretrained(gemma_gguf.parent, gguf_file=gemma_gguf.name, dtype=torch.float32)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    diff = np.abs(logits - ref)
    print(f"gemma-3-270m dequantized: max abs logit difference {diff.max():.3g} "
          f"(logits std {ref.std():.3g}), mean {diff.mean():.3g}, top-1 agreement "
          f"{np.mean(logits.argmax(-1) == ref.argmax(-1)):.4f}; float64 oracle (41 positions) "
          f"{np.abs(oracle - ref[:41]).max():.3g}")
    assert np.mean(logits.argmax(-1) == ref.argmax(-1)) > 0.99
    assert diff.max() < 5e-3  # measured 6e-4 (logits std 11.5): float32 summation order
    assert np.abs(oracle - ref[:41]).max() < 5e-4  # measured 9.9e-5
