"""`slm push` / `slm pull` against a real registry (Debian's docker-registry, distribution 2.8)
on the real SmolLM2 with a LoRA; skopeo reads what slm pushed."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from dist_fixtures import registry, skopeo  # noqa: F401  (fixtures)


pytestmark = pytest.mark.real_model

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    import make_random_lora

    return make_random_lora.make_random_lora(tmp_path_factory.mktemp("smol-lora") / "lora", rank=8, seed=1)


@pytest.fixture(scope="module")
def pushed(tmp_path_factory, registry, smollm2_gguf, lora):  # noqa: F811
    """Store A with SmolLM2 + LoRA active, pushed once; its logits for PROMPT."""
    from slm.cli import run

    root = tmp_path_factory.mktemp("push")
    a = root / "a"
    ref = f"{registry.host}/fleet/smol:v1"
    assert run(["--store", str(a), "init"]) == 0
    assert run(["--store", str(a), "import", "base", str(smollm2_gguf), "--name", "smollm2"]) == 0
    assert run(["--store", str(a), "import", "adapter", str(lora), "--name", "demo"]) == 0
    assert run(["--store", str(a), "activate", "smollm2", "demo@0.8"]) == 0
    assert run(["--store", str(a), "run", PROMPT, "-n", "4", "--logits-out", str(root / "a.npy")]) == 0
    return {"store": a, "ref": ref, "logits": np.load(root / "a.npy"), "root": root}


def _json(cli, *args):
    r = cli(*args, "--json")
    assert r.code == 0, r.err
    return r.json()


def test_push_pull_round_trip_same_id_bit_identical_logits(cli, tmp_path, registry, pushed):  # noqa: F811
    first = _json(cli, "--store", pushed["store"], "push", pushed["ref"])
    comp_id = first["composition_id"]
    assert first["blobs_uploaded"] == first["layers"] + 1 and first["bytes_uploaded"] > 90e6  # + config
    again = _json(cli, "--store", pushed["store"], "push", pushed["ref"])
    assert again["blobs_uploaded"] == 0 and again["bytes_uploaded"] == 0
    assert again["manifest_digest"] == first["manifest_digest"]

    b = tmp_path / "b"
    assert cli("--store", b, "init").code == 0
    got = _json(cli, "--store", b, "pull", pushed["ref"])
    assert got["composition_id"] == comp_id and got["manifest_digest"] == first["manifest_digest"]
    assert got["blobs_downloaded"] == first["blobs_uploaded"] and got["bytes_downloaded"] == first["bytes_uploaded"]
    assert cli("--store", b, "activate", comp_id).code == 0
    assert _json(cli, "--store", b, "status")["active"]["id"] == comp_id
    r = cli("--store", b, "run", PROMPT, "-n", "4", "--logits-out", tmp_path / "b.npy")
    assert r.code == 0, r.err
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), pushed["logits"])
    assert cli("--store", b, "fsck").code == 0


def test_pull_into_a_store_with_the_base_downloads_only_the_adapter(cli, tmp_path, registry, pushed, smollm2_gguf):  # noqa: F811
    from slm.compose.adapter_manifest import parse_adapter_manifest
    from slm.store import StoreDir

    _json(cli, "--store", pushed["store"], "push", pushed["ref"])
    c = tmp_path / "c"
    assert cli("--store", c, "init").code == 0
    assert cli("--store", c, "import", "base", smollm2_gguf, "--name", "smollm2").code == 0
    got = _json(cli, "--store", c, "pull", pushed["ref"])
    a = StoreDir.open(pushed["store"])
    adapter = a.names.get("adapters", "demo")
    record = a.names.get("compositions", got["composition_id"][7:])
    expected = {adapter, record, *parse_adapter_manifest(a.objects.read_verified(adapter)).blob_digests()}
    adapter_bytes = sum(a.objects.size(d) for d in expected)
    assert got["blobs_downloaded"] == len(expected) + 1  # + the OCI config blob
    assert adapter_bytes < got["bytes_downloaded"] < adapter_bytes + 4096  # the config is small
    assert got["blobs_reused"] == got["layers"] - len(expected)
    assert cli("--store", c, "activate", got["composition_id"]).code == 0


def test_skopeo_reads_the_manifest_and_copies_it_to_an_oci_layout(cli, tmp_path, registry, pushed, skopeo):  # noqa: F811
    from slm.distribution import mediatypes as mt

    pushed_json = _json(cli, "--store", pushed["store"], "push", pushed["ref"])
    raw = subprocess.run([skopeo, "inspect", "--raw", "--tls-verify=false", f"docker://{pushed['ref']}"],
                         check=True, capture_output=True).stdout
    manifest = json.loads(raw)
    assert manifest["artifactType"] == mt.ARTIFACT_COMPOSITION
    assert len(manifest["layers"]) == pushed_json["layers"]
    layout = tmp_path / "layout"
    subprocess.run([skopeo, "copy", "--src-tls-verify=false", f"docker://{pushed['ref']}", f"oci:{layout}:v1"],
                   check=True, capture_output=True)
    d = tmp_path / "d"
    assert cli("--store", d, "init").code == 0
    got = _json(cli, "--store", d, "import", "bundle", layout)
    assert got["composition_id"] == pushed_json["composition_id"]
    assert got["manifest_digest"] == pushed_json["manifest_digest"]
