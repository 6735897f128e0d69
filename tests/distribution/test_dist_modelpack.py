"""ModelPack artifacts both ways. One built without slm (an OCI layout written by hand, copied
by skopeo) with a GGUF weight layer and a GGUF LoRA layer is pulled by slm into exactly the
base and adapter `slm import` makes of those files; `slm push --as modelpack` writes the
ModelPack media types (read back by skopeo) and the base's original GGUF bytes; what the format
cannot say is refused."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from dist_fixtures import local_registry, registry, skopeo  # noqa: F401  (fixtures)
from helpers import refused, snapshot, tiny_store
from model_artifact_helpers import inspect_raw, publish, publisher_world, pull_json

ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_TAR = "application/vnd.cncf.model.weight.v1.tar"
DOC = "application/vnd.cncf.model.doc.v1.raw"


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    return publisher_world(tmp_path_factory.mktemp("modelpack"), tiny_model)


def _config(name="tiny"):
    return {"descriptor": {"name": name}, "config": {"format": "gguf"}, "modelfs": {}}


def test_pull_modelpack_gguf_gives_the_base_slm_import_gives(cli, tmp_path, registry, skopeo, world):  # noqa: F811
    from slm.store import StoreDir

    ref = f"{registry.host}/mp/tiny:v1"
    publish(skopeo, tmp_path / "layout", ref, CONFIG, _config(), [
        (WEIGHT, world["gguf"].read_bytes(), {"org.cncf.model.filepath": "model-q.gguf"}),
        (WEIGHT, world["lora"].read_bytes(), {"org.cncf.model.filepath": "demo.gguf"}),  # told by its header
        (DOC, b"# tiny\n", {"org.cncf.model.filepath": "README.md"})], ARTIFACT)
    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    got = pull_json(cli, store, ref)
    names = StoreDir(store).names
    assert got["base_name"] == "tiny" and names.get("bases", "tiny") == world["base"]
    assert got["adapter_names"] == ["demo"] and names.get("adapters", "demo") == world["adapter"]
    assert cli("--store", store, "activate", got["composition_id"]).code == 0
    again = pull_json(cli, store, ref)  # the same artifact again: the same composition, nothing new
    assert again["composition_id"] == got["composition_id"] and again["new_blobs"] == 0


def test_pull_modelpack_refuses_a_tampered_weight_and_changes_nothing(cli, tmp_path, skopeo, world):  # noqa: F811
    (tmp_path / "reg").mkdir()
    with local_registry(tmp_path / "reg") as own:  # its own: the tampered blob is the base's sha256
        ref = f"{own.host}/mp/tampered:v1"
        manifest = publish(skopeo, tmp_path / "layout", ref, CONFIG, _config(),
                           [(WEIGHT, world["gguf"].read_bytes(), {})], ARTIFACT)
        blob = own.blob_path(manifest["layers"][0]["digest"])
        data = bytearray(blob.read_bytes())
        data[-1] ^= 1
        blob.write_bytes(bytes(data))
        store = tmp_path / "b"
        assert cli("--store", store, "init").code == 0
        r = refused(cli, store, 5, "pull", ref)
    assert "does not hash" in r.err


def test_pull_refuses_an_artifact_with_a_safetensors_layer(cli, tmp_path, registry, skopeo, world):  # noqa: F811
    ref = f"{registry.host}/mp/mixed:v1"
    publish(skopeo, tmp_path / "layout", ref, CONFIG, _config(), [
        (WEIGHT, world["gguf"].read_bytes(), {}),
        ("application/vnd.docker.ai.safetensors", b"\0" * 16, {})], ARTIFACT)
    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    r = refused(cli, store, 4, "pull", ref)
    assert "safetensors" in r.err


def test_pull_refuses_a_weight_layer_claiming_more_than_a_blob_can_be(cli, tmp_path, world):
    from slm.distribution.bundle import MAX_BLOB_BYTES
    from slm.distribution.model_artifacts import parse_model_manifest
    from slm.errors import InvalidInput

    doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "artifactType": ARTIFACT,
           "config": {"mediaType": CONFIG, "digest": "sha256:" + "0" * 64, "size": 10},
           "layers": [{"mediaType": WEIGHT, "digest": "sha256:" + "1" * 64, "size": MAX_BLOB_BYTES + 1}]}
    with pytest.raises(InvalidInput, match="more than a blob of its kind can be"):
        parse_model_manifest(json.dumps(doc).encode(), "m")


def test_push_as_modelpack_shows_modelpack_types_and_the_original_gguf(cli, tmp_path, registry, skopeo, world):  # noqa: F811
    ref = f"{registry.host}/mp/pushed:v1"
    r = cli("--store", world["store"], "push", "--as", "modelpack", ref, "tq", "--json")
    assert r.code == 0, r.err
    manifest = inspect_raw(skopeo, ref)
    assert manifest["artifactType"] == ARTIFACT and manifest["config"]["mediaType"] == CONFIG
    assert [l["mediaType"] for l in manifest["layers"]] == [WEIGHT]
    layer = manifest["layers"][0]
    want = hashlib.sha256(world["gguf"].read_bytes()).hexdigest()
    assert layer["digest"] == f"sha256:{want}" and layer["size"] == world["gguf"].stat().st_size
    assert registry.blob_path(layer["digest"]).read_bytes() == world["gguf"].read_bytes()
    assert layer["annotations"]["org.opencontainers.image.title"] == "tq.gguf"


def test_push_as_modelpack_of_a_composition_round_trips_through_slmpull_json(cli, tmp_path, registry, skopeo, world):  # noqa: F811
    from slm.store import StoreDir

    ref = f"{registry.host}/mp/comp:v1"
    src = tmp_path / "a"
    tiny_store(tmp_path, {"gguf_q": world["gguf"]}, {}, steps=(
        ("import", "adapter", world["lora"], "--name", "demo"), ("activate", "tq", "demo")), store=src)
    r = cli("--store", src, "push", "--as", "modelpack", ref, "--json")
    assert r.code == 0, r.err
    manifest = inspect_raw(skopeo, ref)
    assert [l["annotations"].get("org.slm.adapter.name") for l in manifest["layers"]] == [None, "demo"]
    assert manifest["annotations"]["org.slm.composition.id"] == r.json()["composition_id"]
    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    got = pull_json(cli, store, ref)
    assert got["composition_id"] == r.json()["composition_id"]
    assert StoreDir(store).names.get("bases", "tq") == world["base"]


def test_push_as_modelpack_refuses_an_adapter_weight_other_than_1(cli, tmp_path, registry, world):  # noqa: F811
    src = tmp_path / "a"
    tiny_store(tmp_path, {"gguf_q": world["gguf"]}, {"demo": 1}, steps=(("activate", "tq", "demo@0.5"),), store=src)
    before = snapshot(src)
    r = cli("--store", src, "push", "--as", "modelpack", f"{registry.host}/mp/weighted:v1")
    assert r.code == 6 and "weight 0.5" in r.err, r.err
    assert snapshot(src) == before


@pytest.mark.parametrize("extra", [b"x" * 4096, b""])
def test_a_weight_layer_served_longer_or_altered_is_refused_and_leaves_nothing(cli, tmp_path, world, extra):
    """A registry (the fake one: it serves what it is told) sends the GGUF layer with bytes past
    its descriptor's size, or the right size with one byte changed: exit 5, the store unchanged,
    nothing left in tmp/."""
    from fake_registry import FakeRegistry

    gguf = world["gguf"].read_bytes()
    digest = "sha256:" + hashlib.sha256(gguf).hexdigest()
    config = json.dumps({"descriptor": {"name": "x"}, "config": {"format": "gguf"},
                         "modelfs": {"type": "layers", "diffIds": [digest]}}).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "artifactType": ARTIFACT,
                           "config": {"mediaType": CONFIG, "digest": config_digest, "size": len(config)},
                           "layers": [{"mediaType": WEIGHT, "digest": digest, "size": len(gguf)}]}).encode()
    served = gguf + extra if extra else gguf[:-1] + bytes([gguf[-1] ^ 1])
    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    with FakeRegistry(manifest, {digest: served, config_digest: config}) as reg:
        r = refused(cli, store, 5, "pull", f"{reg.host}/mp/liar:v1")
    assert ("longer than" if extra else "does not hash") in r.err
    assert not any((store / "tmp").iterdir())


@pytest.mark.real_model
def test_smollm2_goes_out_as_its_own_gguf_and_comes_back_as_the_same_base(cli, tmp_path, registry, skopeo,  # noqa: F811
                                                                          smollm2_gguf):
    """The real SmolLM2 Q4_1: pushed as ModelPack its one layer is the original file (sha256 of
    the file; streamed in chunks), and pulled into another store it is the base `slm import
    base` made."""
    from slm.store import StoreDir

    a, b = tmp_path / "a", tmp_path / "b"
    assert cli("--store", a, "init").code == 0
    assert cli("--store", a, "import", "base", smollm2_gguf, "--name", "smollm2").code == 0
    ref = f"{registry.host}/mp/smollm2:q4_1"
    r = cli("--store", a, "push", "--as", "modelpack", ref, "smollm2", "--json")
    assert r.code == 0, r.err
    sha = hashlib.sha256()
    with open(smollm2_gguf, "rb") as f:
        while chunk := f.read(1 << 24):
            sha.update(chunk)
    layer = inspect_raw(skopeo, ref)["layers"][0]
    assert layer["digest"] == f"sha256:{sha.hexdigest()}" and layer["size"] == smollm2_gguf.stat().st_size
    assert cli("--store", b, "init").code == 0
    got = pull_json(cli, b, ref)
    assert got["base_name"] == "smollm2"
    assert StoreDir(b).names.get("bases", "smollm2") == StoreDir(a).names.get("bases", "smollm2")


def _tar(*files: tuple[str, bytes]) -> bytes:
    """A tar as modctl packs a weight file: the file under its path (a directory entry first)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("weights")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        for name, data in files:
            info = tarfile.TarInfo(f"weights/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_pull_modelpack_weight_tar_gives_the_base_of_the_file_inside(cli, tmp_path, registry, skopeo, world):  # noqa: F811
    from slm.store import StoreDir

    ref = f"{registry.host}/mp/tarred:v1"
    publish(skopeo, tmp_path / "layout", ref, CONFIG, _config("tarred"), [
        (WEIGHT_TAR, _tar(("model-q.gguf", world["gguf"].read_bytes())), {"org.cncf.model.filepath": "weights"})],
        ARTIFACT)
    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    got = pull_json(cli, store, ref)
    assert StoreDir(store).names.get("bases", got["base_name"]) == world["base"]
    assert not any((store / "tmp").iterdir())


def test_pull_refuses_a_weight_tar_of_two_files(cli, tmp_path, registry, skopeo, world):  # noqa: F811
    ref = f"{registry.host}/mp/tar2:v1"
    publish(skopeo, tmp_path / "layout", ref, CONFIG, _config(), [
        (WEIGHT_TAR, _tar(("a.gguf", world["gguf"].read_bytes()), ("b.gguf", b"GGUF")), {})], ARTIFACT)
    store = tmp_path / "b"
    assert cli("--store", store, "init").code == 0
    r = refused(cli, store, 4, "pull", ref)
    assert "more than one file" in r.err


@pytest.mark.parametrize("point", ["journal.before-intent", "bundle.before-commit", "bundle.before-record",
                                   "journal.before-clear"])
def test_a_crash_while_committing_a_pulled_model_leaves_old_or_new(cli, tmp_path, registry, skopeo, world, point):  # noqa: F811
    """The pull of a model artifact commits through the receive transaction: a crash at each of
    its points leaves, after `slm fsck --repair`, the store as it was or with the pulled
    composition (then activatable); `slm fsck` is clean either way. (The GGUF frame's side name
    is set after the transaction: a crash loses only it, and pulling again sets it.)"""
    import os
    import subprocess
    import sys

    ref = f"{registry.host}/mp/crash:v1"
    publish(skopeo, tmp_path / "layout", ref, CONFIG, _config("crash"), [
        (WEIGHT, world["gguf"].read_bytes(), {}), (WEIGHT, world["lora"].read_bytes(), {"org.slm.adapter.name": "s"})],
        ARTIFACT)
    store = tmp_path / "s"
    assert cli("--store", store, "init").code == 0
    old = sorted(p.relative_to(store) for p in (store / "names").rglob("*") if p.is_file())
    r = subprocess.run([sys.executable, "-m", "slm", "--store", str(store), "pull", ref], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "SLM_FAULTS": f"crash@point={point}"})
    assert r.returncode == 86, r.stderr
    assert cli("--store", store, "fsck", "--repair").code == 0
    assert cli("--store", store, "fsck").code == 0
    names = sorted(str(p.relative_to(store / "names")) for p in (store / "names").rglob("*") if p.is_file())
    if point in ("bundle.before-record", "journal.before-clear"):
        assert [n.split("/")[0] for n in names] == ["adapters", "bases", "compositions"]
        comp = next(n for n in names if n.startswith("compositions/")).split("/")[1]
        assert cli("--store", store, "activate", comp).code == 0
        again = pull_json(cli, store, ref)  # pulling again sets the frame's name: exportable as GGUF
        assert again["composition_id"].endswith(comp)
        out = tmp_path / "back.gguf"
        assert cli("--store", store, "export", "crash", "--format", "gguf", "-o", out).code == 0
        assert out.read_bytes() == world["gguf"].read_bytes()
    else:
        assert sorted(p.relative_to(store) for p in (store / "names").rglob("*") if p.is_file()) == old
