"""The architecture descriptions (slm.arch) and what reads them, without torch: names, shapes,
manifest checks, config.json mapping and refusals, the sliding-window KV ring."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import numpy as np
import pytest

from slm import arch as archs
from slm.errors import InvalidInput
from slm.formats import llama as names
from slm.formats.hf_checkpoint import architecture_from_config

ROOT = Path(__file__).resolve().parents[2]


def _arch(family: str, **over) -> dict:
    """A small, valid [architecture] table of `family` (with the fields the family records)."""
    a = {"family": family, "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_layers": 7,
         "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "context_length": 64, "rms_norm_eps": 1e-6,
         "rope_theta": 1e6, "tie_word_embeddings": True}
    if "sliding_window" in archs.get(family).fields:
        a |= {"sliding_window": 3, "layer_types": archs.layer_pattern(7, 6), "rope_theta_local": 1e4,
              "query_pre_attn_scalar": 8.0, "final_logit_softcap": 0.0}
    return a | over


def _hf_config(model_type: str, **over) -> dict:
    return {"model_type": model_type, "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
            "tie_word_embeddings": True, **over}


@pytest.mark.parametrize("family", sorted(archs.FAMILIES))
def test_every_tensor_has_one_hf_name_and_back(family):
    desc = archs.get(family)
    shapes = names.expected_shapes(_arch(family))
    for name in shapes:
        module = names.gguf_to_hf_module(name, desc)
        assert module is not None, name
        assert names.hf_to_gguf_name(f"{module}.{name.rsplit('.', 1)[1]}", desc) == name
    # the flags decide the tensor set
    layer0 = {n.split(".", 2)[2] for n in shapes if n.startswith("blk.0.")}
    assert ("post_ffw_norm.weight" in layer0) == desc.post_norms
    assert ("attn_q_norm.weight" in layer0) == desc.qk_norm
    assert ("attn_q.bias" in layer0) == desc.qkv_bias
    assert len(layer0) == 9 + 2 * desc.post_norms + 2 * desc.qk_norm + 3 * desc.qkv_bias


def test_descriptions_are_well_formed():
    for family, desc in archs.FAMILIES.items():
        assert desc.family == family and desc.activation in archs.ACTIVATIONS
        assert desc.gguf_qk_row_layout in archs.QK_LAYOUTS
        assert set(desc.fields) <= set(archs.OPTIONAL_FIELDS)
        archs.check(_arch(family), family)  # the sample table passes its own family's check
    gguf_archs = [d.gguf_arch for d in archs.FAMILIES.values()]
    assert len(set(gguf_archs)) == len(gguf_archs)


@pytest.mark.parametrize("change, message", [
    (lambda a: a.pop("sliding_window"), "missing architecture field sliding_window"),
    (lambda a: a.update(layer_types=["full_attention"] * 6), "layer_types"),
    (lambda a: a.update(layer_types=["local"] * 7), "layer_types"),
    (lambda a: a.update(sliding_window=0), "sliding layers need a sliding_window"),
    (lambda a: a.update(rope_theta_local=-1.0), "rope_theta_local"),
    (lambda a: a.update(family="mistral"), "not supported"),
    (lambda a: a.update(num_kv_heads=3), "multiple of num_kv_heads"),
])
def test_manifest_architecture_refusals(change, message):
    a = _arch("gemma3")
    change(a)
    with pytest.raises(InvalidInput, match=message):
        archs.check(a, "m")


def test_a_llama_table_with_a_gemma_field_is_refused():
    with pytest.raises(InvalidInput, match="sliding_window is not one of llama's"):
        archs.check(_arch("llama", sliding_window=4), "m")


def test_hyperparameters_fill_what_a_family_does_not_record():
    h = archs.hyperparameters(_arch("qwen3"))
    assert h["layer_types"] == ["full_attention"] * 7 and h["sliding_window"] == 0
    assert h["query_pre_attn_scalar"] == 8.0 and h["rope_theta_local"] == 1e6
    assert h["final_logit_softcap"] == 0.0


# ------------------------------------------------------------------- config.json mapping

def test_gemma3_config_in_the_older_spelling():
    """google/gemma-3-270m's config.json as published (transformers 4.5x): rope_theta and
    rope_local_base_freq, the pattern only as _sliding_window_pattern."""
    cfg = _hf_config("gemma3_text", hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=8,
                     sliding_window=3, rope_local_base_freq=10000.0, _sliding_window_pattern=6,
                     rope_scaling=None, final_logit_softcapping=None, attn_logit_softcapping=None)
    a = architecture_from_config(cfg, "g")
    assert a["layer_types"] == archs.layer_pattern(7, 6) and a["layer_types"][5] == "full_attention"
    assert (a["rope_theta"], a["rope_theta_local"], a["sliding_window"]) == (1e6, 1e4, 3)
    cfg["final_logit_softcapping"] = 30.0
    assert architecture_from_config(cfg, "g")["final_logit_softcap"] == 30.0


@pytest.mark.parametrize("model_type, over, message", [
    ("gemma3_text", {"hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0},
     "attention logit softcapping"),
    ("gemma3_text", {"hidden_activation": "silu"}, "activation 'silu' is not gemma3's"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 8}, "sliding-window attention is not supported"),
    ("qwen3", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "RoPE type 'yarn'"),
    ("gemma3", {}, "model_type 'gemma3' is not supported"),
    ("mistral", {}, "gemma3_text, llama, qwen2, qwen3"),
    ("qwen2", {"layer_types": 5}, "malformed value"),
    ("gemma3_text", {"hidden_activation": "gelu_pytorch_tanh", "rope_parameters": [1]}, "malformed value"),
    ("qwen3", {"num_attention_heads": 0, "head_dim": None}, "malformed value"),
])
def test_config_refusals_are_one_line(model_type, over, message):
    with pytest.raises(InvalidInput, match=message) as err:
        architecture_from_config(_hf_config(model_type, **over), "dir")
    assert "\n" not in str(err.value) and str(err.value).startswith("dir: ")


# ------------------------------------------------------------------------ the KV ring

def test_sliding_layer_cache_returns_each_windows_keys_in_order():
    """Keys tagged with their position: what a chunk's queries get back is exactly the
    positions their windows need, and the ring never holds more than the window."""
    from slm.model.decoder import Config, KVCache

    cfg = Config.from_architecture(_arch("gemma3"), "hf")  # window 3; layer 5 full
    cache = KVCache(cfg, capacity=20)
    start = 0
    for size in (2, 1, 1, 4, 1, 5, 1):
        k = np.arange(start, start + size, dtype=np.float32)[:, None, None] * np.ones((1, 2, 8), np.float32)
        keys, _, first = cache.extend(0, start, k, k)
        seen = keys[:, 0, 0].astype(int).tolist()
        if size == 1 and start >= 3:  # one query: the whole ring, any order
            assert sorted(seen) == list(range(start - 2, start + 1))
        else:
            assert seen == list(range(start - first, start + size)) and start - first == max(0, start - 2)
        full, _, _ = cache.extend(5, start, k, k)
        assert full[:, 0, 0].astype(int).tolist() == list(range(start + size))
        start += size
        cache.length = start
    assert cache.k[0].shape[0] == 3 and cache.k[5].shape[0] == 20
    state = cache.state()
    assert state["k0"][:, 0, 0].astype(int).tolist() == [start - 3, start - 2, start - 1]


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_memory_estimate_counts_the_kv_cache_the_executor_allocates(family):
    from slm.compose.memory import estimate
    from slm.model.decoder import Config, KVCache

    a = _arch(family)
    cache = KVCache(Config.from_architecture(a, "hf"), capacity=50)
    allocated = sum(k.nbytes + v.nbytes for k, v in zip(cache.k, cache.v))
    assert estimate(a, 0, 0, positions=50).kv_cache == allocated


# -------------------------------------------------------------------------- layering

def _slm_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("slm"):
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("slm")}
    return found


def test_descriptions_sit_below_the_readers_and_the_executor():
    for path in (ROOT / "slm" / "arch").glob("*.py"):
        assert {i for i in _slm_imports(path) if not i.startswith(("slm.arch", "slm.errors"))} == set(), path


def test_the_oracle_shares_no_code_with_the_executor():
    imports = _slm_imports(ROOT / "slm" / "model" / "oracle.py")
    executor = ("slm.model.decoder", "slm.model.mathops", "slm.model.kernels")
    assert not [i for i in imports if i.startswith(executor)]
    assert [i for i in imports if i.startswith("slm.model.overlays")] == ["slm.model.overlays.TargetData"]


def test_manifest_round_trip_keeps_the_family_fields():
    from slm.compose.base_manifest import BaseManifest, TensorRecord, parse_base_manifest
    from slm import quant

    a = _arch("gemma3")
    digest = "blake3:" + "0" * 64
    records = tuple(TensorRecord(n, s, "f32", quant.get_codec("f32").nbytes(s), digest)
                    for n, s in names.expected_shapes(a).items())
    m = BaseManifest("gguf", "f32", "hf", copy.deepcopy(a), digest, "gguf", records)
    assert parse_base_manifest(m.to_bytes()).architecture == a
