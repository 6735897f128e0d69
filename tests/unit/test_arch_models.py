"""Gemma 3, Qwen2 and Qwen3 on tiny fixtures (scripts/make_tiny_model.py --arch): slm's HF and
GGUF imports, its executor and its float64 oracle against transformers (and PEFT); sliding
windows across decode steps; adapters on and off."""

from __future__ import annotations

import numpy as np
import pytest

import make_tiny_model
from helpers import exact

pytestmark = pytest.mark.oracle  # the fixtures are built with transformers' own classes

ARCHS = ["gemma3", "qwen2", "qwen3"]
IDS = [5, 17, 42, 99, 123, 7, 250, 31, 8, 64, 300, 2]  # 12 positions: 3 Gemma windows of 4
TOL = 1e-4
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Config fields transformers' GGUF loader does not map for these architectures (llama.cpp
# derives them: Gemma 3's scale from key_length, Qwen3's head_dim is key_length).
GGUF_CONFIG_GAPS = {"gemma3": {"query_pre_attn_scalar": 32}, "qwen3": {"head_dim": 32}}


@pytest.fixture(scope="module", params=ARCHS)
def fixture(request, tmp_path_factory):
    arch = request.param
    return make_tiny_model.make_tiny_model(tmp_path_factory.mktemp(arch), seed=0, arch=arch)


@pytest.fixture(scope="module")
def imported(fixture, tmp_path_factory):
    from slm.ops.store.importing import import_base
    from slm.store import init_store

    store, _ = init_store(tmp_path_factory.mktemp("store") / "s")
    import_base(store, fixture["hf"], "hf", quant="f32")
    import_base(store, fixture["gguf"], "gguf")
    import_base(store, fixture["gguf_q"], "gguf-q")
    return store


def _torch_logits(model, ids=IDS) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def _transformers(fixture, gguf_name=None):
    import torch
    from transformers import AutoModelForCausalLM

    if gguf_name is None:
        return AutoModelForCausalLM.from_pretrained(fixture["hf"], dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(fixture["outdir"], gguf_file=gguf_name, dtype=torch.float32,
                                                **GGUF_CONFIG_GAPS.get(fixture["arch"], {}))


def _ours(store, name, ids=IDS, kernels=None):
    from slm.ops.infer.loading import load_base_model

    model = load_base_model(store, name).model
    if kernels is not None:
        model.kernels = kernels
    exact(model)  # compared with transformers within TOL
    return model.forward(np.asarray(ids), model.new_cache(len(ids)), "all")


def _oracle(store, name, ids=IDS):
    from slm.model.oracle import Oracle
    from slm.ops.infer.loading import load_base_model

    loaded = load_base_model(store, name)
    return Oracle(loaded.staged.base.architecture, loaded.staged.base.qk_row_layout, loaded.model.t).logits(ids)


# ------------------------------------------------------------------------------ imports

def test_fixture_is_deterministic(fixture, tmp_path):
    again = make_tiny_model.make_tiny_model(tmp_path, seed=0, arch=fixture["arch"])
    for key in ("gguf", "gguf_q"):
        assert again[key].read_bytes() == fixture[key].read_bytes()
    for path in sorted(fixture["hf"].iterdir()):
        assert (again["hf"] / path.name).read_bytes() == path.read_bytes(), path.name



def test_hf_and_gguf_imports_describe_the_same_model(imported, fixture):
    from slm.ops.store.resolve import load_base

    _, hf = load_base(imported, "hf")
    _, gg = load_base(imported, "gguf")
    as_f32 = {**hf.architecture, "rms_norm_eps": float(np.float32(hf.architecture["rms_norm_eps"]))}
    assert as_f32 == gg.architecture and hf.architecture["family"] == fixture["arch"]  # (GGUF eps: f32)
    # llama.cpp permutes q/k rows for the Llama family only
    assert hf.qk_row_layout == gg.qk_row_layout == "hf"
    # float32 both ways: the same bytes, Gemma's norms included (HF import adds the 1 the
    # converter added)
    assert {t.name: t.digest for t in hf.tensors} == {t.name: t.digest for t in gg.tensors}


def test_gemma3_manifest_records_the_attention_pattern(imported, fixture):
    if fixture["arch"] != "gemma3":
        pytest.skip("Gemma 3 only")
    from transformers import AutoConfig

    from slm.ops.store.resolve import load_base

    arch = load_base(imported, "gguf")[1].architecture
    config = AutoConfig.from_pretrained(fixture["hf"])
    assert arch["layer_types"] == config.layer_types
    assert arch["sliding_window"] == config.sliding_window
    assert arch["rope_theta_local"] == config.rope_parameters["sliding_attention"]["rope_theta"]
    assert arch["rope_theta"] == config.rope_parameters["full_attention"]["rope_theta"]
    assert arch["query_pre_attn_scalar"] == config.query_pre_attn_scalar


# -------------------------------------------------------------------- against transformers

@pytest.mark.parametrize("source", ["hf", "gguf", "gguf-q"])
def test_logits_agree_with_transformers(imported, fixture, source):
    gguf_name = {"hf": None, "gguf": "model.gguf", "gguf-q": "model-q.gguf"}[source]
    ref = _torch_logits(_transformers(fixture, gguf_name))
    assert ref.std() > 0.3  # not flat
    np.testing.assert_allclose(_ours(imported, source), ref, atol=TOL, rtol=0)
    np.testing.assert_allclose(_oracle(imported, source), ref, atol=TOL, rtol=0)


def test_gguf_logits_agree_with_llama_cpp(imported, fixture):
    """llama.cpp on the same F32 GGUF: its own reading of the metadata (Gemma 3's hard-coded
    pattern of 6, local RoPE base, scale from key_length) and its own windows (40 positions,
    ten windows of 4). GGML's GELU goes through a float16 lookup table: Gemma 3 within 5e-3
    (measured 1.7e-3, 6e-4 with our GELU input and output rounded to float16); Qwen 1.4e-6."""
    llama_cpp = pytest.importorskip("llama_cpp")
    ids = [1] + np.random.default_rng(0).integers(3, fixture["vocab_size"], 39).tolist()
    ll = llama_cpp.Llama(model_path=str(fixture["gguf"]), n_ctx=64, n_batch=64, n_ubatch=64, logits_all=True,
                         n_threads=1, verbose=False, type_k=0, type_v=0)  # F32 KV cache
    ll.eval(ids)
    ref = np.array(ll.scores[:len(ids)], dtype=np.float32)
    tol = 5e-3 if fixture["arch"] == "gemma3" else TOL
    np.testing.assert_allclose(_ours(imported, "gguf", ids), ref, atol=tol, rtol=0)


def test_gemma3_attention_scale_and_softcap_from_config(fixture, tmp_path):
    """query_pre_attn_scalar other than head_dim (the 27B's case) and a final softcap (none in
    any Gemma 3, honoured if set): only config.json can say so."""
    import json
    import shutil

    from slm.ops.store.importing import import_base
    from slm.store import init_store

    if fixture["arch"] != "gemma3":
        pytest.skip("Gemma 3 only")
    hf = shutil.copytree(fixture["hf"], tmp_path / "hf")
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "query_pre_attn_scalar": 20, "final_logit_softcapping": 1.5}))
    store, _ = init_store(tmp_path / "s")
    import_base(store, hf, "hf", quant="f32")
    ref = _torch_logits(_transformers({**fixture, "hf": hf}))
    np.testing.assert_allclose(_ours(store, "hf"), ref, atol=TOL, rtol=0)
    np.testing.assert_allclose(_oracle(store, "hf"), ref, atol=TOL, rtol=0)
    assert np.abs(ref).max() < 1.5 and np.abs(ref - _torch_logits(_transformers(fixture))).max() > 0.01


def test_long_prompt_takes_the_two_range_path(imported, fixture):
    """70 positions: the executor splits attention over two query ranges (windowed ones too)."""
    ids = list(np.random.default_rng(5).integers(0, fixture["vocab_size"], 70))
    ref = _torch_logits(_transformers(fixture), ids)
    np.testing.assert_allclose(_ours(imported, "hf", ids), ref, atol=TOL, rtol=0)


# ------------------------------------------------------------ decoding and the KV cache

@pytest.mark.parametrize("kernels", ["reference", "fused"])
def test_decode_in_chunks_matches_one_prefill(imported, fixture, kernels):
    """Chunks of 1 and of several positions, before and after a sliding layer's ring wraps."""
    from slm.model import kernels_native
    from slm.model.kernels import ReferenceKernels
    from slm.ops.infer.loading import load_base_model

    if kernels == "fused" and not kernels_native.available():
        pytest.skip("C kernels not built")
    ids = list(np.random.default_rng(1).integers(0, fixture["vocab_size"], 21))
    model = load_base_model(imported, "gguf-q").model
    model.kernels = ReferenceKernels() if kernels == "reference" else kernels_native.NativeKernels()
    whole = model.forward(np.asarray(ids), model.new_cache(len(ids)), "all")
    cache = model.new_cache(len(ids))
    rows, at = [], 0
    for size in (3, 1, 1, 5, 1, 2, 6, 1, 1):
        rows.append(model.forward(np.asarray(ids[at:at + size]), cache, "all"))
        at += size
    assert at == len(ids)
    np.testing.assert_allclose(np.concatenate(rows), whole, atol=2e-5, rtol=0)
    window = model.cfg.sliding_window
    for layer, keys in enumerate(cache.k):  # a sliding layer holds only its window
        assert keys.shape[0] == (window if model.cfg.window(layer) else len(ids))


def test_prefix_cache_state_restores_a_wrapped_ring(imported, fixture):
    from slm.ops.infer.loading import load_base_model

    model = load_base_model(imported, "gguf").model
    ids = list(np.random.default_rng(2).integers(0, fixture["vocab_size"], 11))
    cache = model.new_cache(16)
    model.forward(np.asarray(ids[:9]), cache, "last")
    state = cache.state()
    fresh = model.new_cache(12)  # another capacity: the state is kept in position order
    assert fresh.restore(state, 9)
    np.testing.assert_array_equal(model.forward(np.asarray(ids[9:]), fresh, "all"),
                                  model.forward(np.asarray(ids[9:]), cache, "all"))
    assert not model.new_cache(8).restore(state, 9)


# -------------------------------------------------------------------------------- PEFT

@pytest.fixture(scope="module")
def lora(fixture, tmp_path_factory):
    """LoRA r=4 on all seven projections, random non-zero A and B (fixed seed), and the
    transformers + PEFT logits with it."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(7)
    peft_model = get_peft_model(_transformers(fixture), LoraConfig(
        r=4, lora_alpha=8, target_modules=PROJECTIONS, init_lora_weights=False, lora_dropout=0.0))
    out = tmp_path_factory.mktemp("lora") / "adapter"
    peft_model.save_pretrained(out)
    peft_model.eval()
    return out, _torch_logits(peft_model)


def test_peft_lora_agrees_and_comes_off_bit_for_bit(cli, store, fixture, lora):
    from slm.ops.store.activation import active
    from slm.ops.infer.loading import load_composition

    if fixture["arch"] == "qwen3":
        pytest.skip("Gemma 3 and Qwen2 (biases) cover the adapter path")
    adapter, ref = lora

    def logits(*composition):
        assert cli("activate", *composition).code == 0
        model = load_composition(store, active(store)).model
        return model.forward(np.asarray(IDS), model.new_cache(len(IDS)), "all")

    assert cli("import", "base", fixture["gguf"], "--name", "b").code == 0
    r = cli("import", "adapter", adapter, "--name", "a")
    assert r.code == 0, r.err
    base = logits("b")
    with_lora = logits("b", "a")
    assert np.abs(with_lora - base).max() > 0.05  # the adapter does something
    np.testing.assert_allclose(with_lora, ref, atol=TOL, rtol=0)
    np.testing.assert_array_equal(logits("b"), base)
    assert cli("activate", "b", "a").code == 0
    report = cli("verify", "--json")
    assert report.code == 0, report.err
    assert report.json()["numerics"]["max_abs_error"] < TOL


def _write_gguf_lora(path, adapter_dir, arch: str, alpha: float) -> None:
    """The PEFT adapter as convert_lora_to_gguf.py writes it for this architecture: names from
    gguf-py's tensor map, lora_a (r, in) and lora_b (out, r) in F32, rows not permuted (the
    converter permutes only where the model class does: Llama)."""
    import gguf
    from safetensors.numpy import load_file

    spec = make_tiny_model.ARCHS[arch]
    names = gguf.get_tensor_name_map(spec["gguf_arch"], spec["layers"])
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[spec["gguf_arch"]])
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for key, value in sorted(load_file(str(adapter_dir / "adapter_model.safetensors")).items()):
        module, part = key.removeprefix("base_model.model.").rsplit(".lora_", 1)
        w.add_tensor(f"{names.get_name(module)}.weight.lora_{part[0].lower()}", value.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_lora_of_the_family_agrees_with_peft(cli, store, fixture, lora, tmp_path):
    if fixture["arch"] == "qwen3":
        pytest.skip("Gemma 3 and Qwen2 cover the adapter path")
    adapter, ref = lora
    path = tmp_path / "lora.gguf"
    _write_gguf_lora(path, adapter, fixture["arch"], alpha=8.0)
    assert cli("import", "base", fixture["gguf"], "--name", "b").code == 0
    r = cli("import", "adapter", path, "--name", "g", "--json")
    assert r.code == 0, r.err
    shown = cli("show", "g", "--json").json()
    assert shown["row_layout"] == "hf" and shown["requires"]["family"] == fixture["arch"]
    from slm.ops.store.activation import active
    from slm.ops.infer.loading import load_composition

    assert cli("activate", "b", "g").code == 0
    model = load_composition(store, active(store)).model
    np.testing.assert_allclose(model.forward(np.asarray(IDS), model.new_cache(len(IDS)), "all"), ref, atol=TOL, rtol=0)
