"""Adapter file readers on files built by hand (safetensors / gguf packages: neither torch nor
peft): PEFT directories (LoRA, IA³, SHiRA) and llama.cpp GGUF LoRA files, what slm reads from
them and every malformed or unsupported file refused in one line. The comparisons with PEFT
itself are in test_adapter_formats.py.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from gguf import GGMLQuantizationType as QT

from adapter_format_fixtures import (
    PEFT_WARNINGS,
    LORA_CFG,
    P,
    SHIRA_CFG,
    _gguf_pair,
    _lora_tensors,
    _shira,
    _write_gguf_lora,
    _write_peft,
    one_line_error,
)
from slm.errors import InvalidInput, NotFound
from slm.formats.gguf_lora import is_gguf_lora, read_gguf_lora
from slm.formats.peft import is_peft_dir, read_peft_adapter

pytestmark = PEFT_WARNINGS


# ====================================================== hand-made PEFT files (no torch needed)

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
