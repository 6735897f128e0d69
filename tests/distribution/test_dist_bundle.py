"""`slm export` / `slm import bundle` on the tiny model: same composition id, same logits, and
every kind of tampering refused with the store unchanged."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from helpers import TINY_LORA, one_line, snapshot

@pytest.fixture(scope="module")
def tiny_lora(tmp_path_factory):
    import make_random_lora

    return make_random_lora.make_random_lora(tmp_path_factory.mktemp("lora") / "lora", seed=3, std=0.2, **TINY_LORA)


@pytest.fixture
def source(cli, tmp_path, tiny_model, tiny_lora):
    """Store A: the tiny base + a LoRA, composition active."""
    src = tmp_path / "a"
    assert cli("--store", src, "init").code == 0
    assert cli("--store", src, "import", "base", tiny_model["gguf"], "--name", "tiny").code == 0
    assert cli("--store", src, "import", "adapter", tiny_lora, "--name", "demo").code == 0
    r = cli("--store", src, "activate", "tiny", "demo@0.7", "--json")
    assert r.code == 0, r.err
    return src, r.json()["active"]["id"]


@pytest.fixture
def target(cli, tmp_path):
    dst = tmp_path / "b"
    assert cli("--store", dst, "init").code == 0
    return dst


def _logits(cli, store: Path, out: Path) -> np.ndarray:
    r = cli("--store", store, "run", "hello world", "-n", "3", "--logits-out", out, "--json")
    assert r.code == 0, r.err
    return np.load(out)


@pytest.mark.parametrize("suffix", ["", ".tar"])
def test_bundle_round_trip_same_id_same_logits(cli, tmp_path, source, target, suffix):
    src, comp_id = source
    bundle = tmp_path / f"bundle{suffix}"
    r = cli("--store", src, "export", "-o", bundle, "--json")
    assert r.code == 0, r.err
    assert r.json()["composition_id"] == comp_id
    r = cli("--store", target, "import", "bundle", bundle, "--json")
    assert r.code == 0, r.err
    got = r.json()
    assert got["composition_id"] == comp_id and got["base_name"] == "tiny" and got["adapter_names"] == ["demo"]
    assert cli("--store", target, "activate", comp_id[7:19]).code == 0
    assert cli("--store", target, "status", "--json").json()["active"]["id"] == comp_id
    np.testing.assert_array_equal(_logits(cli, target, tmp_path / "b.npy"), _logits(cli, src, tmp_path / "a.npy"))
    assert cli("--store", target, "fsck").code == 0
    again = cli("--store", target, "import", "bundle", bundle, "--json").json()
    assert again["new_blobs"] == 0 and again["blobs_downloaded"] == 1  # the config only


def test_bundle_layout_media_types_and_digests(cli, tmp_path, source):
    """The layout is what the OCI image spec says, and every layer carries its BLAKE3 digest."""
    from slm.distribution import mediatypes as mt
    from slm.store import digest as dg

    src, comp_id = source
    bundle = tmp_path / "bundle"
    assert cli("--store", src, "export", "-o", bundle, "--tag", "v1").code == 0
    assert json.loads((bundle / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((bundle / "index.json").read_text())
    desc = index["manifests"][0]
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == "v1"
    blobs = bundle / "blobs" / "sha256"
    for path in blobs.iterdir():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name
    manifest = json.loads((blobs / desc["digest"][7:]).read_text())
    assert manifest["artifactType"] == mt.ARTIFACT_COMPOSITION and manifest["config"]["mediaType"] == mt.CONFIG
    config = json.loads((blobs / manifest["config"]["digest"][7:]).read_bytes())
    assert config["composition_id"] == comp_id
    kinds = [l["mediaType"] for l in manifest["layers"]]
    assert kinds[:3] == [mt.COMPOSITION, mt.BASE_MANIFEST, mt.TOKENIZER]
    assert kinds.count(mt.ADAPTER_MANIFEST) == 1 and set(kinds) <= set(mt.LAYER_TYPES)
    for layer in manifest["layers"]:
        data = (blobs / layer["digest"][7:]).read_bytes()
        assert len(data) == layer["size"] and dg.of_bytes(data) == layer["annotations"][mt.BLAKE3_ANNOTATION]


def test_export_is_reproducible_and_leaves_the_store_unchanged(cli, tmp_path, source):
    src, _ = source
    before = snapshot(src)
    assert cli("--store", src, "export", "-o", tmp_path / "one.tar").code == 0
    assert cli("--store", src, "export", "-o", tmp_path / "two.tar").code == 0
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    assert snapshot(src) == before
    r = cli("--store", src, "export", "-o", tmp_path / "one.tar")
    assert r.code == 4 and one_line(r.err)  # never overwrites


def test_base_alone_exports_as_its_base_only_composition(cli, tmp_path, source, target):
    src, _ = source
    r = cli("--store", src, "export", "tiny", "-o", tmp_path / "base", "--json")
    assert r.code == 0, r.err
    got = cli("--store", target, "import", "bundle", tmp_path / "base", "--json")
    assert got.code == 0, got.err
    assert got.json()["composition_id"] == r.json()["composition_id"] and got.json()["adapter_names"] == []
    r = cli("--store", src, "export", "demo", "-o", tmp_path / "adapter")
    assert r.code == 4 and "gguf-lora" in r.err and one_line(r.err)


# -- tampering -------------------------------------------------------------------------------

def _layout(bundle: Path):
    blobs = bundle / "blobs" / "sha256"
    index = json.loads((bundle / "index.json").read_text())
    manifest_path = blobs / index["manifests"][0]["digest"][7:]
    return blobs, index, manifest_path, json.loads(manifest_path.read_text())


def _flip(path: Path, at: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))


def _rewrite_manifest(bundle: Path, manifest: dict) -> None:
    """Write a changed manifest and point index.json at it (a consistent but lying bundle)."""
    blobs, index, old, _ = _layout(bundle)
    data = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    old.unlink()
    index["manifests"][0].update(digest=f"sha256:{digest}", size=len(data))
    (bundle / "index.json").write_text(json.dumps(index))


def _refused(cli, store: Path, bundle: Path, code: int) -> str:
    before = snapshot(store)
    r = cli("--store", store, "import", "bundle", bundle)
    assert r.code == code, (r.code, r.err)
    assert one_line(r.err)
    assert snapshot(store) == before
    return r.err


@pytest.mark.parametrize("role", ["config", "composition", "base-manifest", "tokenizer", "tensor",
                                  "adapter-manifest", "adapter-tensor", "manifest"])
def test_a_flipped_byte_in_any_blob_is_refused(cli, tmp_path, source, target, role):
    from slm.distribution import mediatypes as mt

    src, _ = source
    bundle = tmp_path / "bundle"
    assert cli("--store", src, "export", "-o", bundle).code == 0
    blobs, index, manifest_path, manifest = _layout(bundle)
    layers = manifest["layers"]
    adapter_at = [l["mediaType"] for l in layers].index(mt.ADAPTER_MANIFEST)
    pick = {"config": manifest["config"], "composition": layers[0], "base-manifest": layers[1],
            "tokenizer": layers[2], "tensor": layers[5], "adapter-manifest": layers[adapter_at],
            "adapter-tensor": layers[adapter_at + 1], "manifest": index["manifests"][0]}[role]
    _flip(blobs / pick["digest"][7:], at=pick["size"] // 2)
    err = _refused(cli, target, bundle, 5)
    assert "hash" in err


def test_a_missing_blob_is_refused(cli, tmp_path, source, target):
    src, _ = source
    bundle = tmp_path / "bundle"
    assert cli("--store", src, "export", "-o", bundle).code == 0
    blobs, _, _, manifest = _layout(bundle)
    (blobs / manifest["layers"][7]["digest"][7:]).unlink()
    assert "missing" in _refused(cli, target, bundle, 5)


def test_a_manifest_without_a_blob_the_base_names_is_refused(cli, tmp_path, source, target):
    src, _ = source
    bundle = tmp_path / "bundle"
    assert cli("--store", src, "export", "-o", bundle).code == 0
    _, _, _, manifest = _layout(bundle)
    del manifest["layers"][6]
    _rewrite_manifest(bundle, manifest)
    assert "lacks blob" in _refused(cli, target, bundle, 5)


def test_a_lying_blake3_annotation_is_refused(cli, tmp_path, source, target):
    """The annotation claims another blob's BLAKE3 (one the store may already hold): refused."""
    from slm.distribution import mediatypes as mt

    src, _ = source
    bundle = tmp_path / "bundle"
    assert cli("--store", src, "export", "-o", bundle).code == 0
    _, _, _, manifest = _layout(bundle)
    a, b = manifest["layers"][4], manifest["layers"][5]
    a["annotations"][mt.BLAKE3_ANNOTATION], b["annotations"][mt.BLAKE3_ANNOTATION] = \
        b["annotations"][mt.BLAKE3_ANNOTATION], a["annotations"][mt.BLAKE3_ANNOTATION]
    _rewrite_manifest(bundle, manifest)
    assert "BLAKE3" in _refused(cli, target, bundle, 5)


@pytest.mark.parametrize("where", ["manifest", "layer", "annotation", "config"])
def test_an_unknown_field_is_refused(cli, tmp_path, source, target, where):
    src, _ = source
    bundle = tmp_path / "bundle"
    assert cli("--store", src, "export", "-o", bundle).code == 0
    blobs, _, _, manifest = _layout(bundle)
    if where == "config":
        cfg = json.loads((blobs / manifest["config"]["digest"][7:]).read_bytes())
        cfg["environment"] = "/home/ci"
        data = json.dumps(cfg).encode()
        (blobs / hashlib.sha256(data).hexdigest()).write_bytes(data)
        manifest["config"].update(digest="sha256:" + hashlib.sha256(data).hexdigest(), size=len(data))
    else:
        target_doc = {"manifest": manifest, "layer": manifest["layers"][3],
                      "annotation": manifest["layers"][3]["annotations"]}[where]
        target_doc["x-extra"] = "1"
    _rewrite_manifest(bundle, manifest)
    assert "unknown field" in _refused(cli, target, bundle, 4)


def test_a_tar_with_a_link_is_refused(cli, tmp_path, source, target):
    src, _ = source
    bundle = tmp_path / "bundle.tar"
    assert cli("--store", src, "export", "-o", bundle).code == 0
    with tarfile.open(bundle, "a") as tar:
        link = tarfile.TarInfo("blobs/sha256/" + "0" * 64)
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    assert "not a regular file" in _refused(cli, target, bundle, 4)


def test_a_name_taken_by_another_base_is_refused(cli, tmp_path, source, target, tiny_model):
    src, _ = source
    bundle = tmp_path / "bundle"
    assert cli("--store", src, "export", "-o", bundle).code == 0
    assert cli("--store", target, "import", "base", tiny_model["gguf_q"], "--name", "tiny").code == 0
    assert "already named 'tiny'" in _refused(cli, target, bundle, 4)


def test_garbage_in_place_of_a_bundle_is_a_one_line_error(cli, tmp_path, target):
    (tmp_path / "random.bin").write_bytes(bytes(range(256)) * 40)
    (tmp_path / "empty").mkdir()
    (tmp_path / "badlayout").mkdir()
    (tmp_path / "badlayout" / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (tmp_path / "badlayout" / "index.json").write_text('{"schemaVersion":2,"manifests":[]}')
    for path, code in [(tmp_path / "nope", 3), (tmp_path / "random.bin", 4), (tmp_path / "empty", 4),
                       (tmp_path / "badlayout", 4)]:
        before = snapshot(target)
        r = cli("--store", target, "import", "bundle", path)
        assert r.code == code and one_line(r.err), (path, r.code, r.err)
        assert snapshot(target) == before


def test_an_io_error_at_every_operation_obeys_the_commit_point(cli, tmp_path, source, monkeypatch, tiny_model):
    """EIO at each fs operation of `slm import bundle` (into a store holding the base) in turn:
    before the commit point exit 12 and the store exactly as it was; after it exit 13 and
    `fsck --repair` reaches the new state."""
    import shutil

    from slm.store import fs

    monkeypatch.setattr(fs, "fault_hook", None)  # the CLI installs a plan per run; none left after the test
    src, comp_id = source
    bundle = tmp_path / "bundle"
    assert cli("--store", src, "export", "-o", bundle).code == 0
    pristine = tmp_path / "pristine"
    assert cli("--store", pristine, "init").code == 0
    assert cli("--store", pristine, "import", "base", tiny_model["gguf"], "--name", "tiny").code == 0
    codes = []
    for n in range(1, 2000):
        store = tmp_path / f"s{n}"
        shutil.copytree(pristine, store)
        before = snapshot(store)
        monkeypatch.setenv("SLM_FAULTS", f"eio@op={n}")
        r = cli("--store", store, "import", "bundle", bundle)
        monkeypatch.delenv("SLM_FAULTS")
        codes.append(r.code)
        if r.code == 0:
            break  # past the last operation
        assert one_line(r.err), r.err
        if r.code == 12:
            assert snapshot(store) == before, f"op {n}"
        else:
            assert r.code == 13, (n, r.code, r.err)
            assert cli("--store", store, "fsck", "--repair").code == 0
            assert cli("--store", store, "fsck").code == 0
            assert cli("--store", store, "status").code == 0
            assert cli("--store", store, "activate", comp_id).code == 0, f"op {n}"
        shutil.rmtree(store)
    assert codes[-1] == 0 and codes.count(12) > 20 and 13 in codes
