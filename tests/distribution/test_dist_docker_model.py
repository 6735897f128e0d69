"""Docker model artifacts both ways (Docker Model Runner's format; Ollama's layer types too).
One built without slm (an OCI layout by hand, copied by skopeo) is pulled into exactly the base
and adapter `slm import` makes of its GGUF files; `slm push --as docker` writes Docker's media
types and a config naming the composition, and pulls back to the same composition; what the
format cannot say (an IA3 adapter) is refused, as is a layer whose type lies about its file."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from dist_fixtures import registry, skopeo  # noqa: F401  (fixtures)
from helpers import refused, snapshot, tiny_store
from model_artifact_helpers import inspect_raw, publish, publisher_world, pull_json

CONFIG = "application/vnd.docker.ai.model.config.v0.1+json"
GGUF = "application/vnd.docker.ai.gguf.v3"
LORA = "application/vnd.docker.ai.gguf.v3.lora"
LICENSE = "application/vnd.docker.ai.license"
OLLAMA_ADAPTER = "application/vnd.ollama.image.adapter"


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    return publisher_world(tmp_path_factory.mktemp("docker"), tiny_model)


def _config():
    return {"config": {"format": "gguf", "quantization": "Q4_1"}, "descriptor": {}, "rootfs": {}}


@pytest.mark.parametrize("adapter_type", [LORA, OLLAMA_ADAPTER])
def test_pull_docker_model_gives_the_base_and_adapter_slm_import_gives(cli, tmp_path, registry, skopeo, world,  # noqa: F811
                                                                      adapter_type):
    from slm.store import StoreDir

    ref = f"{registry.host}/ai/tinyllm:{adapter_type.rsplit('.', 1)[-1]}"
    publish(skopeo, tmp_path / "layout", ref, CONFIG, _config(), [
        (GGUF, world["gguf"].read_bytes(), {}), (LICENSE, b"MIT\n", {}),
        (adapter_type, world["lora"].read_bytes(), {"org.opencontainers.image.title": "style.gguf"})])
    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    got = pull_json(cli, store, ref)
    names = StoreDir(store).names
    assert got["base_name"] == "tinyllm" and names.get("bases", "tinyllm") == world["base"]
    assert got["adapter_names"] == ["style"] and names.get("adapters", "style") == world["adapter"]


def test_pull_refuses_a_model_layer_that_is_a_lora_file(cli, tmp_path, registry, skopeo, world):  # noqa: F811
    ref = f"{registry.host}/ai/liar:v1"
    publish(skopeo, tmp_path / "layout", ref, CONFIG, _config(), [
        (GGUF, world["gguf"].read_bytes(), {}), (GGUF, world["lora"].read_bytes(), {})])
    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    r = refused(cli, store, 4, "pull", ref)
    assert "more than one GGUF model layer" in r.err
    ref = f"{registry.host}/ai/liar:v2"
    publish(skopeo, tmp_path / "layout2", ref, CONFIG, _config(), [(GGUF, world["lora"].read_bytes(), {})])
    r = refused(cli, store, 4, "pull", ref)
    assert "the file is a GGUF LoRA adapter" in r.err


def test_pull_refuses_a_config_whose_diff_ids_omit_a_weight_layer(cli, tmp_path, registry, skopeo, world):  # noqa: F811
    ref = f"{registry.host}/ai/diffids:v1"
    other = "sha256:" + hashlib.sha256(b"another file").hexdigest()
    publish(skopeo, tmp_path / "layout", ref, CONFIG, {**_config(), "rootfs": {"type": "layers", "diff_ids": [other]}},
            [(GGUF, world["gguf"].read_bytes(), {})])
    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    r = refused(cli, store, 4, "pull", ref)
    assert "is not among the config's layer digests" in r.err


def test_push_as_docker_writes_docker_types_and_pulls_back(cli, tmp_path, registry, skopeo, world):  # noqa: F811
    ref = f"{registry.host}/ai/pushed:v1"
    src = tmp_path / "a"
    tiny_store(tmp_path, {"gguf_q": world["gguf"]}, {}, steps=(
        ("import", "adapter", world["lora"], "--name", "demo"), ("activate", "tq", "demo")), store=src)
    r = cli("--store", src, "push", "--as", "docker", ref, "--json")
    assert r.code == 0, r.err
    comp_id = r.json()["composition_id"]
    manifest = inspect_raw(skopeo, ref)
    assert manifest["config"]["mediaType"] == CONFIG
    assert [l["mediaType"] for l in manifest["layers"]] == [GGUF, LORA]
    assert manifest["layers"][0]["digest"] == "sha256:" + hashlib.sha256(world["gguf"].read_bytes()).hexdigest()
    config = json.loads(registry.blob_path(manifest["config"]["digest"]).read_bytes())
    assert config["config"]["format"] == "gguf"
    assert config["slm"]["composition_id"] == comp_id
    assert config["slm"]["adapters"] == [{"name": "demo", "weight": 1.0, "file": "demo.gguf"}]
    assert config["rootfs"]["diff_ids"] == [l["digest"] for l in manifest["layers"]]
    again = cli("--store", src, "push", "--as", "docker", ref, "--json").json()
    assert again["blobs_uploaded"] == 0 and again["manifest_digest"] == r.json()["manifest_digest"]
    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    assert pull_json(cli, store, ref)["composition_id"] == comp_id


def _ia3_dir(d):
    from safetensors.numpy import save_file

    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "IA3", "target_modules": ["k_proj"], "feedforward_modules": []}))
    save_file({"base_model.model.model.layers.0.self_attn.k_proj.ia3_l": np.full((32, 1), 1.5, np.float32)},
              str(d / "adapter_model.safetensors"))
    return d


def test_push_as_docker_refuses_an_ia3_adapter_and_a_bundle_received_base(cli, tmp_path, registry, world):  # noqa: F811
    src = tmp_path / "a"
    tiny_store(tmp_path, {"gguf_q": world["gguf"]}, {}, steps=(
        ("import", "adapter", _ia3_dir(tmp_path / "ia3"), "--name", "scale", "--base", "tq"),
        ("activate", "tq", "scale")), store=src)
    before = snapshot(src)
    r = cli("--store", src, "push", "--as", "docker", f"{registry.host}/ai/ia3:v1")
    assert r.code == 6 and "ia3 adapter" in r.err and "no GGUF LoRA form" in r.err, r.err
    assert snapshot(src) == before
    # a base received as slm's bundle has no GGUF file to give back
    assert cli("--store", world["store"], "push", f"{registry.host}/ai/native:v1", "tq").code == 0
    b = tmp_path / "b"
    assert cli("--store", b, "init").code == 0
    assert pull_json(cli, b, f"{registry.host}/ai/native:v1")["base_name"] == "tq"
    r = cli("--store", b, "push", "--as", "docker", f"{registry.host}/ai/native2:v1", "tq")
    assert r.code == 6 and "has no record of the GGUF file it came from" in r.err, r.err


@pytest.mark.hostile
def test_pull_refuses_a_gguf_whose_chat_template_hangs_or_whose_merges_build_nothing(cli, tmp_path, registry,  # noqa: F811
                                                                                     skopeo):
    from template_fixtures import HANG, hostile_gguf

    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    bad = {"hang": {"add_chat_template": HANG}, "merges": {"add_token_merges": ["zzqq yyxx"]}}
    for tag, replaced in bad.items():
        ref = f"{registry.host}/ai/hostile:{tag}"
        gguf = hostile_gguf(tmp_path / f"{tag}.gguf", **replaced)
        publish(skopeo, tmp_path / f"layout-{tag}", ref, CONFIG, _config(), [(GGUF, gguf.read_bytes(), {})])
        r = refused(cli, store, 4, "pull", ref)
        assert ("chat template" if tag == "hang" else "tokenizer") in r.err, r.err
