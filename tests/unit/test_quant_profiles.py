"""Import profiles: `--quant q4_k / q6_k / q5_0 / q5_1 / q4_k_m` on Hugging Face checkpoints, and
the Q4_K_M per-tensor mix checked against llama.cpp's own quantizer (llama_model_quantize).

The tiny generated model's rows are 64 and 128 values long, never a multiple of 256, so on it
every k-quant takes llama.cpp's fallback (Q4_K -> Q5_0, Q6_K -> Q8_0). The Q4_K / Q6_K path
itself is checked on synthetic GGUFs with 256-multiple rows, against llama.cpp.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import one_line
from slm import quant
from slm.compose.base_manifest import parse_base_manifest
from slm.formats import llama
from slm.formats.safetensors_io import SafetensorsFile
from slm.quant import GGMLType, profiles


def _manifest(store, digest):
    return parse_base_manifest(store.objects.read_verified(digest))


def _import(cli, store, path, name, profile):
    r = cli("import", "base", path, "--name", name, "--quant", profile, "--json")
    assert r.code == 0, r.err
    return _manifest(store, r.json()["digest"])


def _assert_stored_is_quantized_weights(store, m, hf_dir):
    """Every stored tensor is the HF weight quantized by the codec named in the manifest."""
    weights = SafetensorsFile(hf_dir / "model.safetensors")
    try:
        for t in m.tensors:
            raw = store.objects.read_verified(t.digest)
            x = weights.float32(llama.gguf_to_hf_module(t.name) + ".weight")
            codec = quant.get_codec(t.dtype)
            expected = codec.quantize(x).reshape(-1)
            np.testing.assert_array_equal(np.frombuffer(raw, np.uint8), expected, err_msg=t.name)
            back = codec.dequantize(raw, t.shape)
            assert np.max(np.abs(back - x)) <= 0.05 * np.max(np.abs(x)), t.name
    finally:
        weights.close()


# Q4_K_M on the tiny model, by llama.cpp's rules (checked against llama.cpp itself below):
# output: Q6_K wanted, row 64 -> Q8_0; layer 1 of 2 uses more bits for attn_v and ffn_down:
# Q6_K -> Q8_0; everything else Q4_K -> Q5_0.
TINY_Q8_0 = {"output.weight", "blk.1.attn_v.weight", "blk.1.ffn_down.weight"}


def test_q4_k_m_import_of_the_tiny_model_takes_the_fallbacks_and_runs(cli, store, tiny_model):
    m = _import(cli, store, tiny_model["hf"], "tiny-q4km", "q4_k_m")
    assert m.quant_profile == "q4_k_m"
    types = {t.name: t.dtype for t in m.tensors}
    assert {n for n, d in types.items() if d == "q8_0"} == TINY_Q8_0
    assert {d for n, d in types.items() if n not in TINY_Q8_0} == {"f32", "q5_0"}
    assert all((t.dtype == "f32") == (len(t.shape) == 1) for t in m.tensors)
    _assert_stored_is_quantized_weights(store, m, tiny_model["hf"])
    r = cli("run", "hello there", "-n", "4", "--base", "tiny-q4km", "--json")
    assert r.code == 0, r.err
    assert len(r.json()["tokens"]) == 4


@pytest.mark.parametrize(("profile", "stored"), [("q4_k", "q5_0"), ("q6_k", "q8_0"),
                                                 ("q5_0", "q5_0"), ("q5_1", "q5_1")])
def test_single_type_profiles_on_the_tiny_model(cli, store, tiny_model, profile, stored):
    m = _import(cli, store, tiny_model["hf"], f"tiny-{profile}", profile)
    assert {t.dtype for t in m.tensors if len(t.shape) == 2} == {stored}
    _assert_stored_is_quantized_weights(store, m, tiny_model["hf"])


def test_unknown_profile_lists_the_new_ones(cli, store, tiny_model):
    r = cli("import", "base", tiny_model["hf"], "--name", "x", "--quant", "q4_k_s")
    assert r.code == 4 and one_line(r.err)
    assert "q4_k_m" in r.err and "q6_k" in r.err


def test_fallback_rules():
    assert profiles.fallback("q4_k", 512) == "q4_k"
    assert profiles.fallback("q4_k", 288) == "q5_0"
    assert profiles.fallback("q6_k", 288) == "q8_0"
    assert profiles.fallback("q4_k", 100) == profiles.fallback("q8_0", 100) == "f16"
    assert profiles.fallback("nf4", 96) == "f16"
    assert profiles.fallback("f32", 7) == "f32"


# ---------------------------------------------------------------- against llama.cpp


@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp")


def llama_cpp_q4_k_m(llama_cpp, src, dst) -> dict[str, tuple[str, np.ndarray]]:
    """Quantize an f32 GGUF with llama.cpp's Q4_K_M; -> {tensor name: (codec name, bytes)}."""
    import gguf

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) == 0
    return {t.name: (GGMLType(int(t.tensor_type)).name.lower(), np.asarray(t.data).view(np.uint8))
            for t in gguf.GGUFReader(dst).tensors}


@pytest.mark.oracle
def test_q4_k_m_import_of_the_tiny_model_matches_llama_cpp(cli, store, tiny_model, llama_cpp,
                                                           tmp_path):
    theirs = llama_cpp_q4_k_m(llama_cpp, tiny_model["gguf"], tmp_path / "q4km.gguf")
    m = _import(cli, store, tiny_model["hf"], "tiny-q4km", "q4_k_m")
    assert {t.name: t.dtype for t in m.tensors} == {n: ty for n, (ty, _) in theirs.items()}
    for t in m.tensors:
        if ".attn_q." in t.name or ".attn_k." in t.name:
            continue  # GGUF permutes these rows for its RoPE layout, HF does not
        ours = np.frombuffer(store.objects.read_verified(t.digest), np.uint8)
        np.testing.assert_array_equal(ours, theirs[t.name][1].reshape(-1), err_msg=t.name)


def write_f32_gguf(path, n_layers: int, ffn: int, tied: bool, seed: int) -> dict[str, np.ndarray]:
    """A synthetic Llama GGUF (f32, no tokenizer: llama_model_quantize needs none); hidden 256."""
    import gguf

    hidden, heads, kv_heads, vocab = 256, 4, 2, 300
    rng = np.random.default_rng(seed)
    shapes = [("token_embd.weight", (vocab, hidden))]
    for i in range(n_layers):
        p = f"blk.{i}."
        shapes += [(p + "attn_norm.weight", (hidden,)), (p + "attn_q.weight", (hidden, hidden)),
                   (p + "attn_k.weight", (hidden * kv_heads // heads, hidden)),
                   (p + "attn_v.weight", (hidden * kv_heads // heads, hidden)),
                   (p + "attn_output.weight", (hidden, hidden)), (p + "ffn_norm.weight", (hidden,)),
                   (p + "ffn_gate.weight", (ffn, hidden)), (p + "ffn_up.weight", (ffn, hidden)),
                   (p + "ffn_down.weight", (hidden, ffn))]
    shapes.append(("output_norm.weight", (hidden,)))
    if not tied:
        shapes.append(("output.weight", (vocab, hidden)))
    tensors = {n: rng.normal(0, 0.02, s).astype(np.float32) for n, s in shapes}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(n_layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


@pytest.mark.oracle
@pytest.mark.parametrize(
    ("n_layers", "ffn", "tied"),
    [(8, 288, False),  # ffn_down rows of 288: Q4_K / Q6_K fall back inside one model
     (12, 256, True)],  # tied embeddings: token_embd is the output, in Q6_K
)
def test_q4_k_m_mix_matches_llama_cpp_with_256_multiple_rows(llama_cpp, tmp_path, n_layers, ffn,
                                                             tied):
    tensors = write_f32_gguf(tmp_path / "f32.gguf", n_layers, ffn, tied, seed=n_layers)
    theirs = llama_cpp_q4_k_m(llama_cpp, tmp_path / "f32.gguf", tmp_path / "q4km.gguf")
    chosen = {n: profiles.tensor_type("q4_k_m", n, x.shape, n_layers, tied)
              for n, x in tensors.items()}
    assert chosen == {n: ty for n, (ty, _) in theirs.items()}
    assert {"q4_k", "q6_k"} <= set(chosen.values())
    for name, x in tensors.items():
        ours = quant.get_codec(chosen[name]).quantize(x)
        np.testing.assert_array_equal(ours.reshape(-1), theirs[name][1].reshape(-1), err_msg=name)
