"""Adapter file readers: PEFT directories (LoRA, IA³, SHiRA) and llama.cpp GGUF LoRA files.

Tests marked `oracle` generate real adapters with torch + peft (scripts/make_adapters.py) for the
tiny model and compare what slm reads with what PEFT itself holds after from_pretrained. The
rest build files by hand (safetensors / gguf packages) and need neither torch nor peft.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import gguf
from gguf import GGMLQuantizationType as QT

from helpers import one_line, snapshot
from slm.errors import Incompatible, InvalidInput, NotFound
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

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]
P = "base_model.model."


def one_line_error(excinfo, *fragments: str) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and msg.strip(), msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


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


# ====================================================== hand-made PEFT files (no torch needed)

LORA_CFG = {"peft_type": "LORA", "r": 2, "lora_alpha": 6, "target_modules": ["q_proj", "down_proj"],
            "base_model_name_or_path": "some/base", "use_rslora": False}


def _write_peft(d: Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})
    return d


def _lora_tensors(rng, module="model.layers.0.self_attn.q_proj", out=8, inp=8, r=2):
    return {
        f"{P}{module}.lora_A.weight": rng.standard_normal((r, inp)).astype(np.float32),
        f"{P}{module}.lora_B.weight": rng.standard_normal((out, r)).astype(np.float32),
    }


def test_minimal_lora_and_bf16(tmp_path):
    rng = np.random.default_rng(1)
    t = _lora_tensors(rng)
    t.update(_lora_tensors(rng, "model.layers.2.mlp.down_proj", out=8, inp=24))
    src = read_peft_adapter(_write_peft(tmp_path / "a", LORA_CFG, t))
    assert [x.module for x in src.targets] == ["blk.0.attn_q.weight", "blk.2.ffn_down.weight"]
    assert all(x.scale == 3.0 for x in src.targets)
    assert src.requires == {"hidden_size": 8, "intermediate_size": 24}
    assert src.config["base_model_name_or_path"] == "some/base"


def test_bf16_tensors_are_widened(tmp_path):
    rng = np.random.default_rng(2)
    A = rng.standard_normal((2, 8)).astype(np.float32)
    B = rng.standard_normal((8, 2)).astype(np.float32)
    bits_a = (A.view(np.uint32) >> 16).astype(np.uint16)
    bits_b = (B.view(np.uint32) >> 16).astype(np.uint16)
    d = _write_peft(tmp_path / "a", LORA_CFG, {"x": np.zeros(1, np.float32)})
    _write_raw_safetensors(d / "adapter_model.safetensors", {
        f"{P}model.layers.0.self_attn.q_proj.lora_A.weight": ("BF16", bits_a),
        f"{P}model.layers.0.self_attn.q_proj.lora_B.weight": ("BF16", bits_b),
    })
    (t,) = read_peft_adapter(d / "adapter_model.safetensors").targets
    np.testing.assert_array_equal(t.tensors["A"], (bits_a.astype(np.uint32) << 16).view(np.float32))
    assert t.tensors["B"].dtype == np.float32


def _write_raw_safetensors(path: Path, entries: dict[str, tuple[str, np.ndarray]],
                           header_text: str | None = None) -> None:
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in entries.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = (header_text or json.dumps(header)).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.mark.parametrize("case, fragment", [
    ("nan", "non-finite"),
    ("mismatched_ranks", "mismatched ranks"),
    ("rank_vs_config", "rank 3 but the config gives it r=2"),
    ("unknown_module", "not a Llama linear layer"),
    ("embedding", "token embedding"),
    ("norm", "normalisation"),
    ("not_selected", "do not select"),
    ("twice", "appears twice"),
    ("dora_tensor", "DoRA"),
    ("lora_bias_tensor", "lora_bias"),
    ("full_tensor", "full tensor"),
    ("half_pair", "lacks its B tensor"),
    ("empty", "empty"),
    ("named_adapter_segment", "without the adapter name"),
])
def test_malformed_lora_tensors_are_refused(tmp_path, case, fragment):
    rng = np.random.default_rng(3)
    t = _lora_tensors(rng)
    q = f"{P}model.layers.0.self_attn.q_proj"
    if case == "nan":
        t[q + ".lora_B.weight"][1, 1] = np.nan
    elif case == "mismatched_ranks":
        t[q + ".lora_B.weight"] = rng.standard_normal((8, 3)).astype(np.float32)
    elif case == "rank_vs_config":
        t = _lora_tensors(rng, r=3)
    elif case == "unknown_module":
        t.update(_lora_tensors(rng, "model.layers.0.self_attn.qkv_proj"))
    elif case == "embedding":
        t.update(_lora_tensors(rng, "model.embed_tokens"))
    elif case == "norm":
        t.update(_lora_tensors(rng, "model.layers.0.input_layernorm"))
    elif case == "not_selected":
        t.update(_lora_tensors(rng, "model.layers.0.self_attn.v_proj"))
    elif case == "twice":
        t.update({k.removeprefix(P): v for k, v in _lora_tensors(rng).items()})
    elif case == "dora_tensor":
        t[q + ".lora_magnitude_vector"] = np.ones(8, np.float32)
    elif case == "lora_bias_tensor":
        t[q + ".lora_B.bias"] = np.zeros(8, np.float32)
    elif case == "full_tensor":
        t[f"{P}lm_head.modules_to_save.weight"] = np.zeros((4, 8), np.float32)
    elif case == "half_pair":
        del t[q + ".lora_B.weight"]
    elif case == "empty":
        t = {}
    elif case == "named_adapter_segment":
        t = {k.replace(".lora_A.", ".lora_A.default."): v for k, v in t.items()}
    d = _write_peft(tmp_path / case, LORA_CFG, t)
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(d)
    one_line_error(e, fragment, "adapter_")


@pytest.mark.parametrize("change, fragment", [
    ({"peft_type": "LOKR"}, "LOKR"),
    ({"peft_type": "ADALORA"}, "ADALORA"),
    ({"use_dora": True}, "DoRA"),
    ({"lora_bias": True}, "lora_bias"),
    ({"bias": "all"}, "bias='all'"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"init_lora_weights": "pissa_niter_4"}, "rewrites the base"),
    ({"layer_replication": [[0, 1]]}, "layer_replication"),
    ({"alora_invocation_tokens": [1, 2]}, "alora_invocation_tokens"),
    ({"r": 0}, "r=0"),
    ({"lora_alpha": "x"}, "lora_alpha"),
    ({"rank_pattern": {"q_proj(": 2}}, "regular expression"),
    ({"target_modules": 3}, "target_modules"),
])
def test_unsupported_lora_configs_are_refused(tmp_path, change, fragment):
    d = _write_peft(tmp_path / "a", {**LORA_CFG, **change}, _lora_tensors(np.random.default_rng(4)))
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(d)
    one_line_error(e, fragment)


def test_fan_in_fan_out_is_ignored_for_linear_layers(tmp_path):
    t = _lora_tensors(np.random.default_rng(5))
    plain = read_peft_adapter(_write_peft(tmp_path / "a", LORA_CFG, t))
    flagged = read_peft_adapter(_write_peft(tmp_path / "b", {**LORA_CFG, "fan_in_fan_out": True}, t))
    np.testing.assert_array_equal(plain.targets[0].tensors["A"], flagged.targets[0].tensors["A"])


def test_truncated_and_garbled_files_are_refused(tmp_path):
    d = _write_peft(tmp_path / "a", LORA_CFG, _lora_tensors(np.random.default_rng(6)))
    f = d / "adapter_model.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(d)
    one_line_error(e, "adapter_model.safetensors")
    (d / "adapter_config.json").write_text("{not json")
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(d)
    one_line_error(e, "adapter_config.json", "JSON")
    (d / "adapter_config.json").write_text('{"peft_type": "LORA", "peft_type": "IA3"}')
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(d)
    one_line_error(e, "appears twice")


def test_duplicate_tensor_key_in_header_is_refused(tmp_path):
    d = _write_peft(tmp_path / "a", LORA_CFG, {"x": np.zeros(1, np.float32)})
    a = np.ones((2, 8), np.float32)
    b = np.ones((8, 2), np.float32)
    key = f"{P}model.layers.0.self_attn.q_proj.lora_"
    text = ('{"%sA.weight": {"dtype": "F32", "shape": [2, 8], "data_offsets": [0, 64]}, '
            '"%sB.weight": {"dtype": "F32", "shape": [8, 2], "data_offsets": [64, 128]}, '
            '"%sB.weight": {"dtype": "F32", "shape": [8, 2], "data_offsets": [64, 128]}}') % (key, key, key)
    _write_raw_safetensors(d / "adapter_model.safetensors", {"a": ("F32", a), "b": ("F32", b)}, text)
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(d)
    one_line_error(e, "appears twice")


def test_pickle_is_never_opened(tmp_path):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps(LORA_CFG))
    sentinel = tmp_path / "pwned"
    import os
    import pickle

    class Boom:
        def __reduce__(self):
            return (os.mkdir, (str(sentinel),))

    (d / "adapter_model.bin").write_bytes(pickle.dumps(Boom()))
    assert is_peft_dir(d)
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(d)
    one_line_error(e, "adapter_model.bin", "pickle")
    assert not sentinel.exists()


def test_directory_errors(tmp_path):
    with pytest.raises(NotFound):
        read_peft_adapter(tmp_path / "missing")
    assert not is_peft_dir(tmp_path) and not is_peft_dir(tmp_path / "missing")
    _write_peft(tmp_path / "outer" / "named", LORA_CFG, _lora_tensors(np.random.default_rng(7)))
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(tmp_path / "outer")
    one_line_error(e, "named")  # points at the sub-directory PEFT writes for a named adapter
    d = tmp_path / "nocfg"
    (d).mkdir()
    (d / "adapter_config.json").write_text(json.dumps(LORA_CFG))
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(d)
    one_line_error(e, "no adapter_model.safetensors")


IA3_CFG = {"peft_type": "IA3", "target_modules": ["k_proj", "down_proj"],
           "feedforward_modules": ["down_proj"]}


def test_ia3_orientation_is_checked(tmp_path):
    k = f"{P}model.layers.0.self_attn.k_proj.ia3_l"
    down = f"{P}model.layers.0.mlp.down_proj.ia3_l"
    ok = {k: np.ones((4, 1), np.float32), down: np.ones((1, 12), np.float32)}
    src = read_peft_adapter(_write_peft(tmp_path / "ok", IA3_CFG, ok))
    assert [(t.module, t.ia3_on, t.tensors["vector"].shape) for t in src.targets] == [
        ("blk.0.attn_k.weight", "output", (4,)), ("blk.0.ffn_down.weight", "input", (12,))]
    assert src.requires == {"intermediate_size": 12}
    assert src.targets[0].in_features == 0  # not known from an output vector alone
    bad = {k: np.ones((1, 4), np.float32), down: np.ones((1, 12), np.float32)}
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(_write_peft(tmp_path / "bad", IA3_CFG, bad))
    one_line_error(e, "expected (out_features, 1)")


SHIRA_CFG = {"peft_type": "SHIRA", "r": 1, "target_modules": ["q_proj", "v_proj"], "mask_type": "random"}


def _shira(rows, cols, values, module="model.layers.0.self_attn.q_proj", idx_dtype=np.int32):
    return {f"{P}{module}.shira_indices": np.array([rows, cols], dtype=idx_dtype),
            f"{P}{module}.shira_weight": np.asarray(values, dtype=np.float32)}


def test_shira_indices_flatten_and_coalesce(tmp_path):
    # q_proj (4, 4) with r = 1 holds 8 values; one position is named twice and must add up.
    rows, cols = [0, 0, 1, 2, 3, 3, 3, 1], [0, 3, 1, 2, 0, 3, 3, 0]
    vals = [1, 2, 3, 4, 5, 6, 7, 8]
    v_rows, v_cols = [0, 1, 1, 0, 1, 0], [0, 1, 2, 3, 3, 2]  # v_proj (2, 4): 6 values
    t = _shira(rows, cols, vals, idx_dtype=np.float32)  # as PEFT saves them on Windows
    t.update(_shira(v_rows, v_cols, np.arange(6) / 10, "model.layers.0.self_attn.v_proj"))
    src = read_peft_adapter(_write_peft(tmp_path / "s", SHIRA_CFG, t))
    q, v = src.targets
    assert (q.out_features, q.in_features, v.out_features, v.in_features) == (4, 4, 2, 4)
    dense = np.zeros(16, np.float32)
    dense[q.tensors["indices"]] = q.tensors["values"]
    expect = np.zeros((4, 4), np.float32)
    np.add.at(expect, (rows, cols), vals)
    np.testing.assert_array_equal(dense.reshape(4, 4), expect)
    assert src.requires["hidden_size"] == 4


@pytest.mark.parametrize("case, fragment", [
    ("out_of_range", "outside"),
    ("negative", "negative"),
    ("count", "not a multiple of r"),
    ("shape", "expected (2, 8)"),
    ("no_q", "pass the base's tensor shapes"),
    ("nan", "non-finite"),
])
def test_malformed_shira_is_refused(tmp_path, case, fragment):
    rows, cols, vals = [0, 0, 1, 2, 3, 3, 3, 1], [0, 3, 1, 2, 0, 3, 2, 0], list(range(8))
    cfg = SHIRA_CFG
    if case == "out_of_range":
        cols[0] = 4
    elif case == "negative":
        rows[0] = -1
    elif case == "nan":
        vals[0] = float("nan")
    if case == "count":
        cfg = {**SHIRA_CFG, "r": 3}
    if case == "shape":
        t = _shira(rows[:7], cols[:7], vals)
    elif case == "no_q":
        t = _shira(rows, cols, vals, "model.layers.0.self_attn.v_proj")
    else:
        t = _shira(rows, cols, vals)
    with pytest.raises(InvalidInput) as e:
        read_peft_adapter(_write_peft(tmp_path / case, cfg, t))
    one_line_error(e, fragment)


# ===================================================================== hand-made GGUF LoRA files

def _write_gguf_lora(path: Path, tensors: dict[str, np.ndarray], alpha: float | None = 8.0,
                     gtype: str = "adapter", arch: str = "llama", adapter_type: str = "lora",
                     qtypes: dict[str, QT] | None = None, extra=None) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gtype)
    w.add_string("adapter.type", adapter_type)
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", alpha)
    if extra:
        extra(w)
    for name, arr in tensors.items():
        qt = (qtypes or {}).get(name, QT.F32)
        if qt == QT.F32:
            w.add_tensor(name, arr.astype(np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr.astype(np.float32), qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _gguf_pair(rng, name="blk.0.attn_q.weight", out=64, inp=64, r=32):
    return {f"{name}.lora_a": rng.standard_normal((r, inp)).astype(np.float32) * 0.1,
            f"{name}.lora_b": rng.standard_normal((out, r)).astype(np.float32) * 0.1}


@pytest.mark.parametrize("qt", [QT.F32, QT.F16, QT.BF16, QT.Q8_0])
def test_gguf_lora_types_decode(tmp_path, qt):
    rng = np.random.default_rng(8)
    t = _gguf_pair(rng)
    t.update(_gguf_pair(rng, "blk.1.ffn_down.weight", out=64, inp=128))
    path = _write_gguf_lora(tmp_path / "a.gguf", t, qtypes={k: qt for k in t})
    assert is_gguf_lora(path)
    src = read_gguf_lora(path)
    assert [x.module for x in src.targets] == ["blk.0.attn_q.weight", "blk.1.ffn_down.weight"]
    tol = {QT.F32: 0, QT.F16: 1e-3, QT.BF16: 1e-2, QT.Q8_0: 1e-2}[qt]
    for x in src.targets:
        assert x.scale == 8.0 / 32 and x.tensors["A"].dtype == np.float32
        np.testing.assert_allclose(x.tensors["A"], t[x.module + ".lora_a"], atol=tol * 0.5)
        np.testing.assert_allclose(x.tensors["B"], t[x.module + ".lora_b"], atol=tol * 0.5)
    assert src.requires == {"family": "llama", "hidden_size": 64, "intermediate_size": 128}


def test_gguf_lora_without_alpha_uses_scale_one(tmp_path):
    path = _write_gguf_lora(tmp_path / "a.gguf", _gguf_pair(np.random.default_rng(9)), alpha=None)
    assert read_gguf_lora(path).targets[0].scale == 1.0  # llama.cpp: alpha 0 -> adapter_scale


def test_base_models_are_not_gguf_loras(tiny_model):
    assert not is_gguf_lora(tiny_model["gguf"])
    assert not is_gguf_lora(tiny_model["hf"] / "config.json")
    with pytest.raises(InvalidInput) as e:
        read_gguf_lora(tiny_model["gguf"])
    one_line_error(e, "model.gguf", "general.type")


@pytest.mark.parametrize("case, fragment", [
    ("nan", "non-finite"),
    ("mismatched_ranks", "mismatched ranks"),
    ("missing_b", "no lora_b"),
    ("unknown_module", "not a Llama linear layer"),
    ("token_embd", "token embedding"),
    ("norm", "norm vector"),
    ("odd_suffix", "neither .lora_a nor .lora_b"),
    ("arch", "'phi3'"),  # (qwen2, gemma3: supported families)
    ("adapter_type", "'cvec'"),
    ("alora", "alora"),
    ("unsupported_type", "Q4_0"),
    ("truncated", "truncated"),
    ("empty", "empty"),
])
def test_malformed_gguf_loras_are_refused(tmp_path, case, fragment):
    rng = np.random.default_rng(10)
    t = _gguf_pair(rng)
    kw = {}
    if case == "nan":
        t["blk.0.attn_q.weight.lora_a"][0, 0] = np.inf
    elif case == "mismatched_ranks":
        t["blk.0.attn_q.weight.lora_b"] = rng.standard_normal((64, 16)).astype(np.float32)
    elif case == "missing_b":
        del t["blk.0.attn_q.weight.lora_b"]
    elif case == "unknown_module":
        t.update(_gguf_pair(rng, "blk.0.attn_qkv.weight"))
    elif case == "token_embd":
        t.update(_gguf_pair(rng, "token_embd.weight"))
    elif case == "norm":
        t["blk.0.attn_norm.weight"] = np.ones(64, np.float32)
    elif case == "odd_suffix":
        t["blk.0.attn_q.weight.lora_c"] = np.ones((2, 2), np.float32)
    elif case == "arch":
        kw["arch"] = "phi3"
    elif case == "adapter_type":
        kw["adapter_type"] = "cvec"
    elif case == "alora":
        kw["extra"] = lambda w: w.add_array("adapter.alora.invocation_tokens", [1, 2])
    elif case == "unsupported_type":
        kw["qtypes"] = {"blk.0.attn_q.weight.lora_a": QT.Q4_0}
    elif case == "empty":
        t = {}
    path = _write_gguf_lora(tmp_path / f"{case}.gguf", t, **kw)
    if case == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(InvalidInput) as e:
        read_gguf_lora(path)
    one_line_error(e, fragment, f"{case}.gguf")


# ====================================================== `slm import adapter --base`: the base's shapes

def _stored_targets(store, name):
    from slm.compose.adapter_manifest import parse_adapter_manifest, tensor_from_bytes

    manifest = parse_adapter_manifest(store.objects.read_verified(store.names.resolve("adapters", name)))
    return {t.module: (t, {k: tensor_from_bytes(r, store.objects.read_verified(r.digest))
                           for k, r in t.tensors.items()}) for t in manifest.targets}


def test_import_with_base_takes_the_shapes_from_the_base(cli, store, store_dir, tiny_model, tmp_path):
    """A SHiRA adapter on v_proj alone does not say its weight's width (the adapter gives only
    out + in): without --base it is refused, with --base the tiny model's (32, 64) places each
    (row, column) pair at row * 64 + column, and it activates."""
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    rng = np.random.default_rng(13)
    flat = rng.choice(32 * 64, size=96, replace=False)  # r = 1: k = out + in = 96 distinct positions
    rows, cols = np.divmod(flat, 64)
    values = rng.standard_normal(96).astype(np.float32)
    d = _write_peft(tmp_path / "shira_v", {**SHIRA_CFG, "target_modules": ["v_proj"]},
                    _shira(rows, cols, values, "model.layers.0.self_attn.v_proj"))
    before = snapshot(store_dir)
    r = cli("import", "adapter", d, "--name", "sv")
    assert r.code == 4 and "pass the base's tensor shapes" in r.err and snapshot(store_dir) == before
    r = cli("import", "adapter", d, "--name", "sv", "--base", "tq")
    assert r.code == 0, r.err
    target, tensors = _stored_targets(store, "sv")["blk.0.attn_v.weight"]
    assert (target.out_features, target.in_features) == (32, 64)
    order = np.argsort(flat)
    np.testing.assert_array_equal(tensors["indices"], flat[order])
    np.testing.assert_array_equal(tensors["values"], values[order])
    assert cli("activate", "tq", "sv").code == 0


def test_import_with_base_completes_ia3_shapes_and_refuses_a_misfit(cli, store, store_dir, tiny_model, tmp_path):
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    ia3 = {"peft_type": "IA3", "target_modules": ["k_proj"], "feedforward_modules": []}
    vector = np.linspace(0.5, 1.5, 32, dtype=np.float32).reshape(32, 1)  # k_proj (32, 64): (out, 1)
    d = _write_peft(tmp_path / "ia3_k", ia3, {f"{P}model.layers.1.self_attn.k_proj.ia3_l": vector})
    assert cli("import", "adapter", d, "--name", "guessed").code == 0
    assert cli("import", "adapter", d, "--name", "given", "--base", "tq").code == 0
    guessed, _ = _stored_targets(store, "guessed")["blk.1.attn_k.weight"]
    given, tensors = _stored_targets(store, "given")["blk.1.attn_k.weight"]
    assert (guessed.out_features, guessed.in_features) == (32, 0)  # the vector says only `out`
    assert (given.out_features, given.in_features) == (32, 64)
    np.testing.assert_array_equal(tensors["vector"], vector.reshape(-1))
    # an adapter for another model: refused at import as an activation would refuse it (6)
    narrow = _write_peft(tmp_path / "narrow", LORA_CFG, _lora_tensors(np.random.default_rng(1)))
    before = snapshot(store_dir)
    r = cli("import", "adapter", narrow, "--name", "narrow", "--base", "tq")
    assert r.code == 6 and "does not fit" in r.err and one_line(r.err), r.err
    assert snapshot(store_dir) == before
    r = cli("import", "adapter", d, "--name", "x", "--base", "nosuchbase")
    assert r.code == 3 and one_line(r.err)


def test_import_with_base_checks_a_gguf_lora_as_an_activation_would(cli, store, store_dir, tiny_model, tmp_path):
    """A GGUF LoRA is fully shaped by its own tensors; --base checks it against the base at
    import (a k projection as wide as q does not fit the tiny model's (32, 64) attn_k)."""
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    rng = np.random.default_rng(21)
    fits = _write_gguf_lora(tmp_path / "fits.gguf", _gguf_pair(rng, "blk.1.attn_k.weight", out=32, inp=64, r=4))
    misfit = _write_gguf_lora(tmp_path / "misfit.gguf", _gguf_pair(rng, "blk.1.attn_k.weight", out=64, inp=64, r=4))
    assert cli("import", "adapter", fits, "--name", "fits", "--base", "tq").code == 0
    before = snapshot(store_dir)
    r = cli("import", "adapter", misfit, "--name", "misfit", "--base", "tq")
    assert r.code == 6 and one_line(r.err) and "64x64 in the adapter, 32x64 in the base" in r.err, r.err
    assert snapshot(store_dir) == before
    assert cli("import", "adapter", misfit, "--name", "misfit").code == 0, "without --base: refused at activation"
    assert cli("activate", "tq", "misfit").code == 6
