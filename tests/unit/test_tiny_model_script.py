"""Tests for scripts/make_tiny_model.py, the tiny synthetic Llama fixture generator.

The oracle tests prove the GGUF files are what llama.cpp's converter would write by loading them
with transformers (which un-permutes q/k and dequantizes) and comparing against the HF checkpoint.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_model.py"
TEXTS = [
    "Hello world, the cat sat.",
    "In 2024 there were 12 ships   in the harbor.\n\tcafé Zürich — naïve!",
    "<|im_start|>user\nWhat is the time?<|im_end|>\n<|im_start|>assistant\n",
]


def _load_script():
    spec = importlib.util.spec_from_file_location("make_tiny_model", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mtm = _load_script()


def _file_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    return mtm.make_tiny_model(out, seed=0)


def _reader_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def _field(reader, key):
    """A metadata value as Python data (ReaderField.contents() only exists in newer gguf-py)."""
    f = reader.fields[key]
    string, array = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY

    def one(i, vtype):
        return bytes(f.parts[i]).decode("utf-8") if vtype == string else f.parts[i].tolist()[0]

    if f.types[0] == array:
        return [one(i, f.types[-1]) for i in f.data]
    return one(f.data[0], f.types[0])


# ------------------------------------------------------------------------------------------
# No torch needed
# ------------------------------------------------------------------------------------------
def test_script_does_not_import_slm():
    src = SCRIPT.read_text()
    assert "import slm" not in src and "from slm" not in src


def test_deterministic_in_process_and_cli(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    mtm.make_tiny_model(a, seed=0)
    mtm.make_tiny_model(b, seed=0)
    # A separate process has fresh hash seeds (Python's and the tokenizers crate's), which is
    # where a tokenizer trainer would show any order dependence.
    subprocess.run([sys.executable, str(SCRIPT), str(c), "--seed", "0"], check=True, capture_output=True)
    fa, fb, fc = _file_bytes(a), _file_bytes(b), _file_bytes(c)
    assert set(fa) == {
        "hf/config.json", "hf/generation_config.json", "hf/model.safetensors",
        "hf/tokenizer.json", "hf/tokenizer_config.json",
        "hf-sharded/config.json", "hf-sharded/generation_config.json",
        "hf-sharded/model-00001-of-00002.safetensors", "hf-sharded/model-00002-of-00002.safetensors",
        "hf-sharded/model.safetensors.index.json", "hf-sharded/tokenizer.json", "hf-sharded/tokenizer_config.json",
        "model.gguf", "model-q.gguf", "model-unsupported.gguf",
    }  # fmt: skip
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs between two in-process runs"
        assert fa[name] == fc[name], f"{name} differs between in-process and CLI runs"


def test_seed_changes_weights_not_tokenizer(tmp_path):
    mtm.make_tiny_model(tmp_path / "s0", seed=0)
    mtm.make_tiny_model(tmp_path / "s1", seed=1)
    f0, f1 = _file_bytes(tmp_path / "s0"), _file_bytes(tmp_path / "s1")
    assert f0["hf/model.safetensors"] != f1["hf/model.safetensors"]
    assert f0["hf/tokenizer.json"] == f1["hf/tokenizer.json"]


def test_gguf_metadata(tiny):
    r = gguf.GGUFReader(tiny["gguf"])
    expect = {
        "general.architecture": "llama",
        "general.name": "slm-tiny-llama",
        "llama.context_length": 256,
        "llama.embedding_length": 64,
        "llama.block_count": 2,
        "llama.feed_forward_length": 128,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.dimension_count": 16,
        "llama.vocab_size": tiny["vocab_size"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.bos_token_id": tiny["bos_token_id"],
        "tokenizer.ggml.eos_token_id": tiny["eos_token_id"],
        "tokenizer.ggml.add_bos_token": False,
    }
    for key, value in expect.items():
        assert _field(r, key) == value, key
    assert _field(r, "llama.rope.freq_base") == pytest.approx(10000.0)
    assert _field(r, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert "<|im_start|>" in _field(r, "tokenizer.chat_template")
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == tiny["vocab_size"]
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert types[:3] == [3, 3, 3] and set(types[3:]) == {1}
    assert len(_field(r, "tokenizer.ggml.merges")) == tiny["vocab_size"] - 256 - 3


def test_gguf_tensor_types(tiny):
    assert set(_reader_types(tiny["gguf"]).values()) == {"F32"}
    q = _reader_types(tiny["gguf_q"])
    assert set(q.values()) == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"}
    assert q["token_embd.weight"] == "Q8_0"
    assert q["output.weight"] == "BF16"
    assert q["output_norm.weight"] == "F32"
    for i in range(2):
        assert q[f"blk.{i}.attn_norm.weight"] == q[f"blk.{i}.ffn_norm.weight"] == "F32"
        assert q[f"blk.{i}.attn_v.weight"] == "F16"
        assert q[f"blk.{i}.ffn_down.weight"] == "Q4_0"
        for t in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert q[f"blk.{i}.{t}.weight"] == "Q4_1"
    u = _reader_types(tiny["gguf_unsupported"])
    assert {n: t for n, t in u.items() if t != "F32"} == {"blk.1.ffn_up.weight": "MXFP4"}
    assert q == tiny["gguf_types"]["gguf_q"] and u == tiny["gguf_types"]["gguf_unsupported"]


def test_gguf_f32_matches_hf_with_permutation(tiny):
    """Pure numpy: GGUF tensors are the HF tensors, q/k permuted, and un-permuting restores them."""
    from safetensors.numpy import load_file

    hf = load_file(tiny["hf"] / "model.safetensors")
    gg = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(tiny["gguf"]).tensors}
    assert len(gg) == len(hf) == 21
    for name, arr in mtm.gguf_tensors(hf):
        np.testing.assert_array_equal(gg[name].reshape(arr.shape), arr)

    def unpermute(w, n_head):  # transformers' LlamaTensorProcessor._reverse_permute_weights
        return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)

    for i in range(2):
        q = gg[f"blk.{i}.attn_q.weight"].reshape(64, 64)
        k = gg[f"blk.{i}.attn_k.weight"].reshape(32, 64)
        np.testing.assert_array_equal(unpermute(q, 4), hf[f"model.layers.{i}.self_attn.q_proj.weight"])
        np.testing.assert_array_equal(unpermute(k, 2), hf[f"model.layers.{i}.self_attn.k_proj.weight"])
        assert not np.array_equal(q, hf[f"model.layers.{i}.self_attn.q_proj.weight"])


def test_sharded_index_covers_all_weights(tiny):
    import json

    from safetensors.numpy import load_file

    idx = json.loads((tiny["hf_sharded"] / "model.safetensors.index.json").read_text())
    single = load_file(tiny["hf"] / "model.safetensors")
    assert set(idx["weight_map"]) == set(single)
    assert sorted(set(idx["weight_map"].values())) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert idx["metadata"]["total_size"] == sum(w.nbytes for w in single.values())
    for fname in set(idx["weight_map"].values()):
        for name, w in load_file(tiny["hf_sharded"] / fname).items():
            assert idx["weight_map"][name] == fname
            np.testing.assert_array_equal(w, single[name])


# ------------------------------------------------------------------------------------------
# Oracle: transformers / torch
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def oracle(tiny):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny["hf"] / "tokenizer.json"))
    hf = transformers.LlamaForCausalLM.from_pretrained(tiny["hf"], dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode(TEXTS[0]).ids])
    with torch.no_grad():
        logits = hf(ids).logits
    return {"torch": torch, "transformers": transformers, "tok": tok, "hf": hf, "ids": ids, "logits": logits}


def _gguf_model(oracle, outdir, name):
    torch, transformers = oracle["torch"], oracle["transformers"]
    m = transformers.AutoModelForCausalLM.from_pretrained(outdir, gguf_file=name, dtype=torch.float32).eval()
    with torch.no_grad():
        return m, m(oracle["ids"]).logits


@pytest.mark.oracle
def test_hf_config_and_logits_not_flat(tiny, oracle):
    c = oracle["hf"].config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (64, 128, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 16)
    assert c.vocab_size == tiny["vocab_size"] and not c.tie_word_embeddings
    logits = oracle["logits"]
    assert logits.shape == (1, oracle["ids"].shape[1], tiny["vocab_size"])
    assert oracle["torch"].isfinite(logits).all()
    assert 0.2 < logits.std().item() < 5.0


@pytest.mark.oracle
def test_gguf_f32_logits_match_hf(tiny, oracle):
    model, logits = _gguf_model(oracle, tiny["outdir"], "model.gguf")
    c = model.config
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size) == (4, 2, 16, tiny["vocab_size"])
    assert not c.tie_word_embeddings
    assert oracle["torch"].allclose(logits, oracle["logits"], atol=1e-5, rtol=0)


@pytest.mark.oracle
def test_sharded_logits_identical(tiny, oracle):
    torch, transformers = oracle["torch"], oracle["transformers"]
    m = transformers.LlamaForCausalLM.from_pretrained(tiny["hf_sharded"], dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(m(oracle["ids"]).logits, oracle["logits"])


# Worst-case |dequantized - original| per element, relative to the block's max |x| (or its
# value range for Q4_1). Loose enough for rounding, far too tight for a wrong permutation.
_QUANT_BOUND = {"Q8_0": 1 / 127, "Q4_0": 1 / 8 + 1e-3, "Q4_1": 1 / 15 + 1e-3}


@pytest.mark.oracle
def test_gguf_quantized_weights_within_type_error(tiny, oracle):
    """transformers dequantizes every type in model-q.gguf (incl. BF16) and un-permutes q/k;
    each weight lands within its type's rounding error of the original."""
    model, logits = _gguf_model(oracle, tiny["outdir"], "model-q.gguf")
    hf_params = dict(oracle["hf"].named_parameters())
    gguf_of = {hf: gg for gg, hf in _hf_names().items()}
    for name, p in model.named_parameters():
        orig = hf_params[name].detach().numpy()
        got = p.detach().numpy()
        kind = tiny["gguf_types"]["gguf_q"][gguf_of[name]]
        err = np.abs(got - orig)
        if kind == "F32":
            assert err.max() == 0, name
        elif kind == "F16":
            assert err.max() <= 1e-3 * np.abs(orig).max(), name
        elif kind == "BF16":
            assert np.all(err <= np.abs(orig) * 2**-8 + 1e-30), name
        else:
            blocks = orig.reshape(-1, 32)
            scale = np.ptp(blocks, axis=1) if kind == "Q4_1" else np.abs(blocks).max(axis=1)
            assert np.all(err.reshape(-1, 32) <= _QUANT_BOUND[kind] * scale[:, None] + 1e-7), (name, kind)
    # end to end the model is still the same model, give or take 4-bit noise
    a, b = oracle["logits"].flatten(), logits.flatten()
    assert oracle["torch"].corrcoef(oracle["torch"].stack([a, b]))[0, 1] > 0.95


def _hf_names() -> dict[str, str]:
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}  # fmt: skip
    for i in range(2):
        for hf_suffix, gg_suffix in mtm.LAYER_NAMES.items():
            names[f"blk.{i}.{gg_suffix}.weight"] = f"model.layers.{i}.{hf_suffix}.weight"
    return names


@pytest.mark.oracle
def test_gguf_unsupported_type_still_loads_in_transformers(tiny, oracle):
    """transformers (via gguf-py) dequantizes MXFP4 too, so the file is a valid GGUF and only a
    runtime that does not read MXFP4 rejects it."""
    model, logits = _gguf_model(oracle, tiny["outdir"], "model-unsupported.gguf")
    got = model.get_parameter("model.layers.1.mlp.up_proj.weight").detach().numpy()
    orig = oracle["hf"].get_parameter("model.layers.1.mlp.up_proj.weight").detach().numpy()
    assert 0 < np.abs(got - orig).max() < 0.25 * np.abs(orig).max()  # MXFP4: 4-bit floats, shared exponent


@pytest.mark.oracle
@pytest.mark.parametrize("gguf_name", ["model.gguf", "model-q.gguf"])
def test_gguf_tokenizer_matches_tokenizer_json(tiny, oracle, gguf_name):
    gt = oracle["transformers"].AutoTokenizer.from_pretrained(tiny["outdir"], gguf_file=gguf_name)
    for text in TEXTS:
        assert gt(text)["input_ids"] == oracle["tok"].encode(text).ids, text
    assert gt.decode(oracle["tok"].encode(TEXTS[1]).ids) == TEXTS[1]
    assert (gt.bos_token, gt.eos_token) == ("<|im_start|>", "<|im_end|>")
    chat = gt.apply_chat_template([{"role": "user", "content": "What is the time?"}],
                                  tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert chat == TEXTS[2]


@pytest.mark.oracle
def test_hf_tokenizer_dir_loads(tiny, oracle):
    ht = oracle["transformers"].AutoTokenizer.from_pretrained(tiny["hf"])
    for text in TEXTS:
        assert ht(text)["input_ids"] == oracle["tok"].encode(text).ids, text
    assert (ht.bos_token, ht.eos_token) == ("<|im_start|>", "<|im_end|>")
