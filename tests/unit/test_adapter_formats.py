"""Adapter file readers against PEFT itself. Tests marked `oracle` generate real adapters with
torch + peft (scripts/make_adapters.py) for the tiny model and compare what slm reads (PEFT
directories: LoRA, IA³, SHiRA; llama.cpp GGUF LoRA files) with what PEFT itself holds after
from_pretrained; the PEFT semantics slm reimplements (names, patterns, module selection) are
checked without torch.

Files built by hand (neither torch nor peft): test_adapter_formats_handmade.py; `slm import
adapter --base`: test_adapter_import_with_base.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adapter_format_fixtures import PEFT_WARNINGS, one_line_error
from slm.errors import Incompatible, InvalidInput
from slm.formats.gguf_lora import is_gguf_lora, read_gguf_lora
from slm.formats.llama import gguf_to_hf_module, hf_to_gguf_name, permute_gguf_to_hf
from slm.formats.peft import (
    ia3_on_input,
    is_peft_dir,
    pattern_value,
    read_peft_adapter,
    select_module,
)

N_HEADS, N_KV_HEADS = 4, 2  # the tiny model's (scripts/make_tiny_model.py)

pytestmark = PEFT_WARNINGS


# ============================================================================ oracle fixtures

@pytest.fixture(scope="session")
def adapters(tiny_model, tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("peft")
    import make_adapters

    return make_adapters.make_adapters(tiny_model["hf"], tmp_path_factory.mktemp("adapters"), seed=0)


@pytest.fixture(scope="session")
def peft_layers(tiny_model, adapters):
    """{adapter name: {HF module path: PEFT tuner layer}} after PeftModel.from_pretrained."""
    import make_adapters
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    out = {}
    for name in ("lora", "lora2", "rslora", "ia3", "shira"):
        model = make_adapters.load_base(tiny_model["hf"])
        pm = PeftModel.from_pretrained(model, str(adapters[name]))
        out[name] = {
            key.removeprefix("base_model.model."): module
            for key, module in pm.named_modules() if isinstance(module, BaseTunerLayer)
        }
    return out


def _np(t) -> np.ndarray:
    return t.detach().float().numpy()


# ======================================================================== oracle: PEFT reads

@pytest.mark.oracle
@pytest.mark.parametrize("name", ["lora", "lora2", "rslora"])
def test_lora_targets_shapes_and_scales_match_peft(adapters, peft_layers, name):
    src = read_peft_adapter(adapters[name])
    assert (src.format, src.kind, src.row_layout) == ("peft", "lora", "hf")
    assert "family" not in src.requires and src.requires["hidden_size"] == 64  # any slm.arch family
    layers = peft_layers[name]
    assert {gguf_to_hf_module(t.module) for t in src.targets} == set(layers)
    for t in src.targets:
        layer = layers[gguf_to_hf_module(t.module)]
        A, B = _np(layer.lora_A["default"].weight), _np(layer.lora_B["default"].weight)
        np.testing.assert_array_equal(t.tensors["A"], A)
        np.testing.assert_array_equal(t.tensors["B"], B)
        assert t.tensors["A"].dtype == np.float32 and t.tensors["B"].dtype == np.float32
        assert t.scale == pytest.approx(layer.scaling["default"], rel=1e-12)
        assert t.rank == layer.r["default"]
        assert (t.out_features, t.in_features) == (layer.out_features, layer.in_features)
        assert np.abs(B).max() > 0  # the fixtures are non-trivial


@pytest.mark.oracle
def test_rslora_patterns_resolve_per_module(adapters, peft_layers):
    src = read_peft_adapter(adapters["rslora"])
    by = {t.module: t for t in src.targets}
    r, alpha = 4, 4  # use_rslora: scale = alpha / sqrt(r)
    assert by["blk.0.attn_q.weight"].rank == 2 * r  # "q_proj"
    assert by["blk.1.ffn_down.weight"].rank == r // 2  # regex on the full module name
    assert by["blk.0.ffn_down.weight"].rank == r
    assert by["blk.0.attn_q.weight"].scale == pytest.approx(alpha / np.sqrt(2 * r))
    assert by["blk.1.ffn_down.weight"].scale == pytest.approx(alpha / np.sqrt(r // 2))
    assert by["blk.0.attn_k.weight"].scale == pytest.approx(3 * r / np.sqrt(r))  # layers\.0\..*k_proj
    assert by["blk.1.attn_k.weight"].scale == pytest.approx(alpha / np.sqrt(r))
    assert by["blk.0.attn_v.weight"].scale == pytest.approx((r // 2) / np.sqrt(r))  # v_proj


@pytest.mark.oracle
def test_lora2_layers_to_transform(adapters):
    src = read_peft_adapter(adapters["lora2"])
    assert sorted(t.module for t in src.targets) == ["blk.0.attn_q.weight", "blk.0.attn_v.weight"]


@pytest.mark.oracle
def test_ia3_vectors_and_placement_match_peft(adapters, peft_layers):
    import torch

    src = read_peft_adapter(adapters["ia3"])
    assert src.kind == "ia3"
    layers = peft_layers["ia3"]
    assert {gguf_to_hf_module(t.module) for t in src.targets} == set(layers)
    rng = np.random.default_rng(0)
    for t in src.targets:
        layer = layers[gguf_to_hf_module(t.module)]
        v = t.tensors["vector"]
        np.testing.assert_array_equal(v, _np(layer.ia3_l["default"]).reshape(-1))
        assert t.ia3_on == ("input" if layer.is_feedforward else "output")
        assert t.ia3_on == ("input" if t.module.endswith("ffn_down.weight") else "output")
        assert t.scale == 1.0
        # The placement, functionally: PEFT's forward against W (v * x) or v * (W x).
        W = _np(layer.get_base_layer().weight)
        x = rng.standard_normal((3, W.shape[1])).astype(np.float32)
        with torch.no_grad():
            y = _np(layer(torch.from_numpy(x)))
        expect = (x * v) @ W.T if t.ia3_on == "input" else (x @ W.T) * v
        np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-6)
        if t.ia3_on == "input":
            assert t.in_features == W.shape[1] and v.shape == (W.shape[1],)
        else:
            assert t.out_features == W.shape[0] and v.shape == (W.shape[0],)


@pytest.mark.oracle
def test_shira_reconstructs_peft_delta(adapters, peft_layers):
    src = read_peft_adapter(adapters["shira"])
    assert src.kind == "sparse" and src.requires["hidden_size"] == 64
    layers = peft_layers["shira"]
    assert {gguf_to_hf_module(t.module) for t in src.targets} == set(layers)
    for t in src.targets:
        layer = layers[gguf_to_hf_module(t.module)]
        idx, vals = t.tensors["indices"], t.tensors["values"]
        assert idx.dtype == np.int64 and vals.dtype == np.float32 and idx.shape == vals.shape
        assert (np.diff(idx) > 0).all()
        dense = np.zeros(t.out_features * t.in_features, dtype=np.float32)
        dense[idx] = vals * t.scale
        expect = _np(layer.get_delta_weight("default").to_dense())
        assert (t.out_features, t.in_features) == expect.shape
        np.testing.assert_array_equal(dense.reshape(expect.shape), expect)
        assert t.scale == layer.scaling["default"] == 1.0


@pytest.mark.oracle
def test_shira_with_base_shapes_agrees(adapters, tiny_model):
    from slm.formats.llama import expected_shapes

    cfg = json.loads((tiny_model["hf"] / "config.json").read_text())
    arch = {"family": "llama", "hidden_size": 64, "intermediate_size": 128, "vocab_size": cfg["vocab_size"],
            "head_dim": 16, "num_heads": 4, "num_kv_heads": 2, "num_layers": 2,
            "tie_word_embeddings": False}
    shapes = expected_shapes(arch)
    inferred = read_peft_adapter(adapters["shira"])
    given = read_peft_adapter(adapters["shira"], base_shapes=shapes)
    for a, b in zip(inferred.targets, given.targets):
        assert (a.module, a.out_features, a.in_features) == (b.module, b.out_features, b.in_features)
        np.testing.assert_array_equal(a.tensors["indices"], b.tensors["indices"])
    ia3 = read_peft_adapter(adapters["ia3"], base_shapes=shapes)
    assert all(t.out_features > 0 and t.in_features > 0 for t in ia3.targets)
    wrong = dict(shapes, **{"blk.0.attn_v.weight": (48, 64)})
    with pytest.raises(Incompatible) as e:  # as an activation on that base would say
        read_peft_adapter(adapters["shira"], base_shapes=wrong)
    one_line_error(e, "does not fit")


@pytest.mark.oracle
def test_gguf_lora_reads_back_the_peft_tensors(adapters):
    peft = {t.module: t for t in read_peft_adapter(adapters["lora"]).targets}
    path = adapters["lora_gguf"]
    assert is_gguf_lora(path) and not is_peft_dir(path)
    src = read_gguf_lora(path)
    assert (src.format, src.kind, src.row_layout) == ("gguf-lora", "lora", "gguf")
    assert src.requires == {"family": "llama", "hidden_size": 64, "intermediate_size": 128}
    assert src.config["adapter.lora.alpha"] == 8.0
    assert [t.module for t in src.targets] == list(peft)
    for t in src.targets:
        ref = peft[t.module]
        np.testing.assert_array_equal(t.tensors["A"], ref.tensors["A"])
        B = t.tensors["B"]
        if t.module.endswith("attn_q.weight"):
            assert not np.array_equal(B, ref.tensors["B"])  # rows really are permuted
            B = permute_gguf_to_hf(B, N_HEADS)
        elif t.module.endswith("attn_k.weight"):
            assert not np.array_equal(B, ref.tensors["B"])
            B = permute_gguf_to_hf(B, N_KV_HEADS)
        np.testing.assert_array_equal(B, ref.tensors["B"])
        assert t.scale == pytest.approx(ref.scale)
        assert (t.out_features, t.in_features) == (ref.out_features, ref.in_features)


@pytest.mark.oracle
@pytest.mark.parametrize("name, fragment", [
    ("dora", "DoRA"), ("loha", "LOHA"), ("modules_to_save", "modules_to_save"),
    ("pickled", "adapter_model.bin"),
])
def test_unsupported_peft_fixtures_are_refused(adapters, name, fragment):
    assert is_peft_dir(adapters[name])
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(adapters[name])
    one_line_error(e, fragment, name)


@pytest.mark.oracle
def test_reference_logits_and_weighted_stack(adapters, tiny_model):
    import make_adapters

    loader = make_adapters.base_loader_for(tiny_model["hf"])
    ids = [1, 5, 9, 42, 7]
    one = make_adapters.reference_logits(loader, adapters["lora"], ids)
    assert one.shape == (5, tiny_model["vocab_size"]) and one.dtype == np.float32
    base = make_adapters._logits(make_adapters.load_base(loader), ids)
    assert np.abs(one - base).max() > 1e-3  # the adapter changes the logits
    halves = make_adapters.stacked_reference_logits(
        loader, [(adapters["lora"], 0.5), (adapters["lora"], 0.5)], ids)
    np.testing.assert_allclose(halves, one, atol=1e-5)
    off = make_adapters.stacked_reference_logits(
        loader, [(adapters["lora"], 0.0), (adapters["lora2"], 0.0)], ids)
    np.testing.assert_allclose(off, base, atol=1e-6)


# =================================================== PEFT semantics reimplemented (no torch)

def test_hf_to_slm_name_mapping():
    assert hf_to_gguf_name("model.layers.3.self_attn.q_proj.weight") == "blk.3.attn_q.weight"
    assert hf_to_gguf_name("model.layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    assert hf_to_gguf_name("lm_head.weight") == "output.weight"
    for hf, gg in [("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                   ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"),
                   ("mlp.up_proj", "ffn_up")]:
        assert gguf_to_hf_module(f"blk.7.{gg}.weight") == f"model.layers.7.{hf}"


def test_pattern_value_follows_peft_get_pattern_key():
    key = "model.layers.1.self_attn.q_proj"
    assert pattern_value({"q_proj": 8}, key, 4) == 8
    assert pattern_value({"proj": 8}, key, 4) == 4  # must match whole components
    assert pattern_value({"_proj": 8}, key, 4) == 4
    assert pattern_value({"layers.1.self_attn.q_proj": 8}, key, 4) == 8
    assert pattern_value({r"layers\.[01]\..*q_proj": 2, "q_proj": 8}, key, 4) == 2  # first wins
    assert pattern_value({"q_proj": 8, r"layers\.[01]\..*q_proj": 2}, key, 4) == 8
    assert pattern_value({"k_proj|q_proj": 3}, key, 4) == 3
    assert pattern_value({}, key, 4) == 4


def test_select_module_follows_peft_matching():
    key = "model.layers.3.self_attn.q_proj"
    assert select_module({"target_modules": ["q_proj"]}, key)
    assert not select_module({"target_modules": ["proj"]}, key)
    assert not select_module({"target_modules": ["q_proj"], "layers_to_transform": [0, 1]}, key)
    assert select_module({"target_modules": ["q_proj"], "layers_to_transform": 3}, key)
    assert select_module({"target_modules": ["q_proj"], "layers_to_transform": [3],
                          "layers_pattern": "layers"}, key)
    assert not select_module({"target_modules": ["q_proj"], "layers_to_transform": [3],
                              "layers_pattern": "blocks"}, key)
    assert select_module({"target_modules": [key], "layers_to_transform": [0]}, key)  # exact name
    assert select_module({"target_modules": r".*\.(q|v)_proj"}, key)
    assert not select_module({"target_modules": r"(q|v)_proj"}, key)  # full match
    assert not select_module({"target_modules": ["q_proj"], "exclude_modules": ["q_proj"]}, key)
    assert select_module({"target_modules": "all-linear"}, key)
    assert not select_module({"target_modules": "all-linear"}, "lm_head")
    assert select_module({"target_modules": None}, key)  # PEFT's llama default: q_proj, v_proj
    assert not select_module({"target_modules": None}, "model.layers.0.mlp.up_proj")
    assert ia3_on_input({"feedforward_modules": ["down_proj"]}, "model.layers.0.mlp.down_proj")
    assert not ia3_on_input({"feedforward_modules": ["down_proj"]}, "model.layers.0.mlp.up_proj")
    assert ia3_on_input({"feedforward_modules": r".*mlp\..*"}, "model.layers.0.mlp.up_proj")
