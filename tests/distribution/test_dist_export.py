"""`slm export --format gguf-lora|peft` on the tiny model: the exported files, read back by slm's
own readers (the GGUF LoRA and PEFT importers, which are tested against llama.cpp's converter
and PEFT), give the composition's logits; non-LoRA adapters and ambiguous requests are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import one_line, snapshot

IDS = [5, 17, 42, 99, 123, 7, 250, 31]


def _lora(tmp_path, name, seed, **over):
    import make_random_lora

    dims = dict(rank=4, alpha=8.0, hidden=64, intermediate=128, layers=2, kv_dim=32, q_dim=64) | over
    return make_random_lora.make_random_lora(tmp_path / name, seed=seed, std=0.3, **dims)


def _rank_mixed_lora(tmp_path):
    """A PEFT LoRA with a rank_pattern and an alpha_pattern (per-module scales)."""
    path = _lora(tmp_path, "mixed", seed=9)
    config = json.loads((path / "adapter_config.json").read_text())
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.1.self_attn.q_proj"
    tensors[f"{key}.lora_A.weight"] = tensors[f"{key}.lora_A.weight"][:2].copy()
    tensors[f"{key}.lora_B.weight"] = tensors[f"{key}.lora_B.weight"][:, :2].copy()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config["rank_pattern"] = {"model.layers.1.self_attn.q_proj": 2}
    config["alpha_pattern"] = {"down_proj": 3.0}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def _logits(store, base, *adapters):
    from slm.ops.infer import compositions
    from slm.ops.infer.loading import load_composition

    model = load_composition(store, compositions.build(store, base, list(adapters))).model
    return model.forward(np.asarray(IDS), model.new_cache(len(IDS)), "all")


@pytest.fixture
def loaded(cli, store, tmp_path, tiny_model):
    assert cli("import", "base", tiny_model["gguf"], "--name", "tiny").code == 0
    assert cli("import", "base", tiny_model["hf"], "--name", "tiny-hf", "--quant", "f32").code == 0
    assert cli("import", "adapter", _lora(tmp_path, "lora", seed=2), "--name", "demo").code == 0
    assert cli("import", "adapter", _rank_mixed_lora(tmp_path), "--name", "mixed").code == 0
    return store


@pytest.mark.parametrize("fmt", ["gguf-lora", "peft"])
@pytest.mark.parametrize("adapter", ["demo", "mixed"])
@pytest.mark.parametrize("base", ["tiny", "tiny-hf"])
def test_export_reimports_to_the_same_logits(cli, loaded, tmp_path, fmt, adapter, base):
    out = tmp_path / ("out.gguf" if fmt == "gguf-lora" else "out")
    r = cli("export", adapter, "--base", base, "--format", fmt, "-o", out, "--json")
    assert r.code == 0, r.err
    assert cli("import", "adapter", out, "--name", "back").code == 0
    want = _logits(loaded, base, f"{adapter}@0.6")
    got = _logits(loaded, base, "back@0.6")
    assert np.abs(want - _logits(loaded, base)).max() > 0.05, "the adapter changes the output"
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def test_gguf_lora_has_llamas_row_layout_and_alpha(cli, loaded, tmp_path):
    """q rows of lora_b permuted as llama.cpp's converter writes them for a Llama."""
    from safetensors.numpy import load_file

    from slm.formats.gguf_lora import read_gguf_lora
    from slm.formats.llama import permute_hf_to_gguf

    out = tmp_path / "demo.gguf"
    assert cli("export", "demo", "--base", "tiny", "--format", "gguf-lora", "-o", out).code == 0
    src = read_gguf_lora(out)  # slm's reader, tested against llama.cpp's converter's files
    meta = src.config
    assert (meta["general.architecture"], meta["general.type"], meta["adapter.type"]) == ("llama", "adapter", "lora")
    assert meta["adapter.lora.alpha"] == 8.0 and src.row_layout == "gguf"
    b = next(t for t in src.targets if t.module == "blk.0.attn_q.weight").tensors["B"]
    peft_b = load_file(str(tmp_path / "lora" / "adapter_model.safetensors"))[
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    np.testing.assert_array_equal(b, permute_hf_to_gguf(peft_b, 4))


def test_export_refusals_are_one_line_and_change_nothing(cli, loaded, tmp_path):
    before = snapshot(loaded.root)
    cases = [
        (("export", "demo", "--format", "gguf-lora", "-o", tmp_path / "x.gguf"), 4, "--base"),
        (("export", "demo", "--base", "tiny", "--format", "onnx", "-o", tmp_path / "x"), 4, "choose one of"),
        (("export", "-o", tmp_path / "x", "--format", "peft"), 3, "nothing is active"),
    ]
    for args, code, words in cases:
        r = cli(*args)
        assert r.code == code and one_line(r.err) and words in r.err, (args, r.code, r.err)
    assert cli("activate", "tiny", "demo", "mixed").code == 0
    before = snapshot(loaded.root)
    r = cli("export", "--format", "peft", "-o", tmp_path / "two")
    assert r.code == 6 and "2 adapters" in r.err and one_line(r.err)
    assert snapshot(loaded.root) == before


def test_gguf_lora_export_in_llama_cpp_on_the_f32_tiny_model(cli, loaded, tiny_model, tmp_path):
    """On an F32 GGUF llama.cpp computes in float32 like slm: the exported adapter must agree
    closely (the row permutation, names, alpha and scale all matter here)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    out = tmp_path / "demo.gguf"
    assert cli("export", "demo", "--base", "tiny", "--format", "gguf-lora", "-o", out).code == 0

    def llama(**kw):
        ll = llama_cpp.Llama(model_path=str(tiny_model["gguf"]), n_ctx=64, n_batch=64, n_ubatch=64,
                             logits_all=True, n_threads=1, verbose=False, type_k=0, type_v=0, **kw)
        ll.eval(IDS)
        scores = np.array(ll.scores[:len(IDS)], dtype=np.float32)
        ll.close()
        return scores

    base_err = np.abs(llama() - _logits(loaded, "tiny")).max()
    ours = _logits(loaded, "tiny", "demo@0.6")
    lora_err = np.abs(llama(lora_path=str(out), lora_scale=0.6) - ours).max()
    print(f"llama.cpp vs slm on the F32 tiny model: base {base_err:.2e}, with the exported LoRA {lora_err:.2e}")
    assert np.abs(ours - _logits(loaded, "tiny")).max() > 0.05
    assert base_err < 1e-4 and lora_err < 1e-4
