"""`slm export --format peft`: base_model_name_or_path names where the base came from (its Hub
id when the checkpoint recorded one, else the path it was imported from; null for a base the
store only received), every file is 0644, and peft's AutoPeftModelForCausalLM loads it."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest

from helpers import TINY_LORA, tiny_store


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _config(out):
    return json.loads((out / "adapter_config.json").read_text())


def test_hf_base_gives_its_directory_and_0644_files(cli, tmp_path, tiny_model, umask_022):
    store_dir = tiny_store(tmp_path, tiny_model, {"a1": 1}, bases={"hfb": "hf"}, steps=())
    out = tmp_path / "peft"
    r = cli("--store", store_dir, "export", "a1", "--base", "hfb", "--format", "peft", "-o", out, "--json")
    assert r.code == 0, r.err
    assert _config(out)["base_model_name_or_path"] == str(tiny_model["hf"].resolve())
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == {"adapter_config.json": 0o644, "adapter_model.safetensors": 0o644}


def test_gguf_base_gives_the_file_it_was_imported_from(cli, tmp_path, tiny_model):
    store_dir = tiny_store(tmp_path, tiny_model, {"a1": 1}, steps=())
    out = tmp_path / "peft"
    assert cli("--store", store_dir, "export", "a1", "--base", "tq", "--format", "peft", "-o", out).code == 0
    assert _config(out)["base_model_name_or_path"] == str(tiny_model["gguf_q"].resolve())


def test_hub_cache_checkpoint_gives_its_hub_id(cli, tmp_path, tiny_model):
    snapshot_dir = tmp_path / "hub" / "models--SomeOrg--tiny-llama" / "snapshots" / "0123abc"
    shutil.copytree(tiny_model["hf"], snapshot_dir)
    store_dir = tiny_store(tmp_path, {"hub": snapshot_dir}, {"a1": 1}, bases={"hubb": "hub"}, steps=())
    out = tmp_path / "peft"
    assert cli("--store", store_dir, "export", "a1", "--base", "hubb", "--format", "peft", "-o", out).code == 0
    assert _config(out)["base_model_name_or_path"] == "SomeOrg/tiny-llama"


def test_received_base_has_no_origin_and_says_null(cli, tmp_path, tiny_model):
    store_dir = tiny_store(tmp_path, tiny_model, {"a1": 1}, steps=(("activate", "tq", "a1"),))
    bundle = tmp_path / "bundle.tar"
    assert cli("--store", store_dir, "export", "-o", bundle).code == 0
    other = tmp_path / "other"
    assert cli("--store", other, "init").code == 0
    received = cli("--store", other, "import", "bundle", bundle, "--json").json()["composition_id"]
    out = tmp_path / "peft"
    assert cli("--store", other, "export", received, "--format", "peft", "-o", out).code == 0
    assert _config(out)["base_model_name_or_path"] is None


@pytest.mark.oracle
def test_auto_peft_model_loads_the_export(cli, tmp_path, tiny_model):
    import torch
    from peft import AutoPeftModelForCausalLM

    store_dir = tiny_store(tmp_path, tiny_model, {"a1": 1}, bases={"hfb": "hf"}, steps=(), lora=None)
    out = tmp_path / "peft"
    assert cli("--store", store_dir, "export", "a1", "--base", "hfb", "--format", "peft", "-o", out).code == 0
    model = AutoPeftModelForCausalLM.from_pretrained(str(out))
    assert type(model).__name__ == "PeftModelForCausalLM"
    lora_b = dict(model.named_parameters())[
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"]
    assert lora_b.shape == (TINY_LORA["q_dim"], TINY_LORA["rank"]) and torch.count_nonzero(lora_b) > 0
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(logits).all()
