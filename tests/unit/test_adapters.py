"""Adapters as overlays on the tiny model: PEFT agreement, reversibility, rejections."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import exact, one_line, snapshot

pytestmark = pytest.mark.oracle

IDS = [5, 17, 42, 99, 123, 7, 250, 31, 8, 64, 300]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_model):
    import make_adapters

    return make_adapters.make_adapters(tiny_model["hf"], tmp_path_factory.mktemp("adapters"), seed=0)


@pytest.fixture(scope="module")
def base_loader(tiny_model):
    import make_adapters

    return make_adapters.base_loader_for(tiny_model["hf"])


@pytest.fixture
def loaded(cli, store, tiny_model, adapters):
    # The F32 GGUF: same weights as the HF checkpoint transformers loads, GGUF q/k row order,
    # so PEFT's HF-layout adapters must be re-ordered to match.
    assert cli("import", "base", tiny_model["gguf"], "--name", "tiny").code == 0
    for name in ("lora", "lora2", "rslora", "ia3", "shira", "lora_gguf"):
        r = cli("import", "adapter", adapters[name], "--name", name)
        assert r.code == 0, r.err
    return store


def _logits(cli, *composition):
    """Activate, then return the prompt logits the executor computes for IDS."""
    from slm.ops.store.activation import active
    from slm.ops.infer.loading import load_composition
    from slm.store import StoreDir, find_store

    assert cli("activate", *composition).code == 0
    store = StoreDir.open(find_store())
    model = exact(load_composition(store, active(store)).model)  # compared with PEFT within 1e-4
    return model.forward(np.asarray(IDS), model.new_cache(len(IDS)), "all")


@pytest.mark.parametrize("name", ["lora", "rslora", "ia3", "shira"])
def test_matches_transformers_peft(cli, loaded, adapters, base_loader, name):
    import make_adapters

    ref = make_adapters.reference_logits(base_loader, adapters[name], IDS)
    ours = _logits(cli, "tiny", name)
    base = _logits(cli, "tiny")
    assert np.abs(ref - base).max() > 1e-2, "the adapter must visibly change the logits"
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_weighted_stack_matches_peft(cli, loaded, adapters, base_loader):
    import make_adapters

    ref = make_adapters.stacked_reference_logits(
        base_loader, [(adapters["lora"], 0.7), (adapters["lora2"], 0.3)], IDS)
    np.testing.assert_allclose(_logits(cli, "tiny", "lora@0.7", "lora2@0.3"), ref, atol=1e-4, rtol=0)


def test_gguf_lora_equals_peft_import(cli, loaded):
    np.testing.assert_allclose(_logits(cli, "tiny", "lora_gguf"), _logits(cli, "tiny", "lora"),
                               atol=1e-5, rtol=0)


def test_reversible_bit_for_bit(cli, loaded, store_dir):
    import blake3

    base_blobs = [t["digest"][7:] for t in cli("show", "tiny", "--json").json()["tensors"]]
    blob_dir = store_dir / "objects" / "blake3"
    before = {name: (blob_dir / name).read_bytes() for name in base_blobs}
    base = _logits(cli, "tiny")
    with_a = _logits(cli, "tiny", "lora")
    assert not np.array_equal(base, with_a)
    assert np.array_equal(_logits(cli, "tiny"), base), "base -> A -> base is bit-identical"
    assert cli("activate", "tiny", "lora", "ia3").code == 0
    assert cli("deactivate", "ia3").code == 0
    assert cli("deactivate", "lora").code == 0
    assert np.array_equal(_logits(cli, "tiny"), base)
    via_a = _logits(cli, "tiny", "rslora")
    _logits(cli, "tiny", "shira")
    assert np.array_equal(_logits(cli, "tiny", "rslora"), via_a), "A -> B equals B directly"
    for name, data in before.items():  # the base's blobs never change
        assert (blob_dir / name).read_bytes() == data
        assert blake3.blake3(data).hexdigest() == name


def test_order_is_part_of_the_identity(cli, loaded):
    ab = cli("activate", "tiny", "lora", "ia3", "--json").json()["active"]["id"]
    ba = cli("activate", "tiny", "ia3", "lora", "--json").json()["active"]["id"]
    assert ab != ba


def _reject(cli, store_dir, args, code):
    before = snapshot(store_dir)
    r = cli(*args)
    assert r.code == code, (r.code, r.err)
    assert one_line(r.err), r.err
    assert snapshot(store_dir) == before
    return r


@pytest.mark.parametrize("name", ["dora", "loha", "modules_to_save", "pickled"])
def test_unsupported_adapters_are_refused(cli, loaded, store_dir, adapters, name):
    _reject(cli, store_dir, ["import", "adapter", adapters[name], "--name", "x"], 4)


def _edited_copy(src, dst, edit_tensors=None, edit_config=None):
    from safetensors.numpy import load_file, save_file

    dst.mkdir()
    config = json.loads((src / "adapter_config.json").read_text())
    if edit_config:
        edit_config(config)
    (dst / "adapter_config.json").write_text(json.dumps(config))
    tensors = load_file(str(src / "adapter_model.safetensors"))
    if edit_tensors:
        tensors = edit_tensors(tensors)
    save_file(tensors, str(dst / "adapter_model.safetensors"))
    return dst


def test_rejections(cli, loaded, store_dir, adapters, tmp_path):
    assert cli("activate", "tiny").code == 0
    # a duplicate adapter
    _reject(cli, store_dir, ["activate", "tiny", "lora", "lora"], 6)
    # a weight that is not a finite number
    for bad in ("nan", "inf", "abc"):
        _reject(cli, store_dir, ["activate", "tiny", f"lora@{bad}"], 4)
    # an unknown adapter
    _reject(cli, store_dir, ["activate", "tiny", "nope"], 3)

    # a NaN in an adapter tensor
    def nan(tensors):
        key = sorted(k for k in tensors if "lora_B" in k)[0]
        tensors[key] = tensors[key].copy()
        tensors[key][0, 0] = np.nan
        return tensors

    d = _edited_copy(adapters["lora"], tmp_path / "nan", nan)
    _reject(cli, store_dir, ["import", "adapter", d, "--name", "nan"], 4)

    # a target the base lacks: rename layer 1 to layer 7 (the tiny base has 2 layers)
    def relayer(tensors):
        return {k.replace("layers.1.", "layers.7."): v for k, v in tensors.items()}

    d = _edited_copy(adapters["lora"], tmp_path / "relayer", relayer)
    assert cli("import", "adapter", d, "--name", "far").code == 0
    r = _reject(cli, store_dir, ["activate", "tiny", "far"], 6)
    assert "blk.7" in r.err

    # an adapter for another hidden size: widen every A to 96 inputs
    def wider(tensors):
        out = {}
        for k, v in tensors.items():
            out[k] = np.concatenate([v, np.zeros((v.shape[0], 32), v.dtype)], 1) if "lora_A" in k else v
        return out

    d = _edited_copy(adapters["lora2"], tmp_path / "wide", wider)
    assert cli("import", "adapter", d, "--name", "wide").code == 0
    r = _reject(cli, store_dir, ["activate", "tiny", "wide"], 6)
    assert "hidden_size" in r.err or "x96" in r.err


def test_prefix_cache_never_crosses_a_switch(cli, loaded):
    assert cli("activate", "tiny", "lora").code == 0
    a1 = cli("run", "the cat", "-n", "4", "--json").json()
    a2 = cli("run", "the cat", "-n", "4", "--json").json()
    assert (a1["prefix_cache"], a2["prefix_cache"]) == ("miss", "hit") and a1["tokens"] == a2["tokens"]
    assert cli("activate", "tiny").code == 0
    b = cli("run", "the cat", "-n", "4", "--json").json()
    assert b["prefix_cache"] == "miss"
    fresh = cli("run", "the cat", "-n", "4", "--base", "tiny", "--json").json()
    assert b["tokens"] == fresh["tokens"]
