"""Every layer of a pushed composition carries `org.opencontainers.image.title`: an independent
OCI client (the `oras` Python SDK, no slm code) pulls it into a directory of readable files,
each holding the bytes the store names; slm still pulls the titled manifest back exactly."""

from __future__ import annotations

import json
import subprocess

import pytest

from dist_fixtures import registry, skopeo  # noqa: F401  (fixtures)
from helpers import tiny_store


@pytest.fixture(scope="module")
def composed(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("titles")
    return tiny_store(root, tiny_model, {"demo": 1}, steps=(("activate", "tq", "demo"),))


def _push(cli, store, ref):
    r = cli("--store", store, "push", ref, "--json")
    assert r.code == 0, r.err
    return r.json()


def _manifest(skopeo, ref):  # noqa: F811
    out = subprocess.run([skopeo, "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_oras_pull_writes_one_readable_file_per_layer(cli, tmp_path, registry, skopeo, composed):  # noqa: F811
    import oras.client

    from slm.compose.base_manifest import parse_base_manifest
    from slm.store import StoreDir

    ref = f"{registry.host}/titles/tiny:v1"
    _push(cli, composed, ref)
    layers = _manifest(skopeo, ref)["layers"]
    titles = [l["annotations"]["org.opencontainers.image.title"] for l in layers]
    assert len(set(titles)) == len(titles)

    out = tmp_path / "pulled"
    client = oras.client.OrasClient(hostname=registry.host, insecure=True)
    files = client.pull(target=ref, outdir=str(out))
    assert sorted(p.rsplit("/", 1)[-1] for p in files) == sorted(titles)
    assert {"composition.toml", "base.toml", "tokenizer.json", "adapter-demo.toml"} <= set(titles)

    store = StoreDir(composed)
    base = parse_base_manifest((out / "base.toml").read_bytes())
    for t in base.tensors:  # each tensor's file is the blob the base manifest names
        assert (out / f"base.{t.name}").read_bytes() == store.objects.read_verified(t.digest)
    assert any(t.startswith("adapter-demo.blk.") and t.endswith(".A") for t in titles)


def test_titled_push_pulls_back_to_the_same_composition(cli, tmp_path, registry, composed):  # noqa: F811
    ref = f"{registry.host}/titles/again:v1"
    pushed = _push(cli, composed, ref)
    assert cli("--store", tmp_path / "b", "init").code == 0
    r = cli("--store", tmp_path / "b", "pull", ref, "--json")
    assert r.code == 0, r.err
    got = r.json()
    assert got["composition_id"] == pushed["composition_id"]
    assert got["manifest_digest"] == pushed["manifest_digest"]


def test_a_title_that_is_a_path_is_refused(tmp_path, composed):
    from slm.distribution.bundle import parse_manifest
    from slm.errors import InvalidInput
    from slm.ops.ship import bundles
    from slm.store import StoreDir

    plan = bundles.plan(StoreDir(composed), None)
    doc = json.loads(plan.manifest_bytes)
    doc["layers"][3]["annotations"]["org.opencontainers.image.title"] = "../../etc/passwd"
    with pytest.raises(InvalidInput, match="not a plain file name"):
        parse_manifest(json.dumps(doc).encode())
