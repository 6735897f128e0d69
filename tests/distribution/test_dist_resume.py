"""An interrupted `slm pull` resumes: the blobs it received whole and verified stay in its staging
area (tmp/pull-<manifest hex>/), and the next pull of the manifest re-hashes and adopts them
instead of downloading them again. What is kept there is not trusted (a corrupted, planted or
linked file is downloaded again), a refused pull still leaves the store as it was, two pulls of
one manifest never share the area, and fsck / gc clean an area abandoned for a day."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import TINY_LORA, snapshot

DAY = 24 * 3600


def _slm(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "slm", *map(str, args)], capture_output=True, text=True,
                          env={**{k: v for k, v in os.environ.items() if k != "SLM_FAULTS"}, **(env or {})}, **kw)


def _pull_json(store: Path, ref: str) -> dict:
    r = _slm("--store", store, "pull", ref, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def world(tmp_path_factory, registry, tiny_model):  # noqa: F811
    """A composition (tiny base + LoRA) pushed; an empty store; a full pull's counts; and the fs
    operation just after the store kept half of the layers it streams (from a trace)."""
    import make_random_lora

    root = tmp_path_factory.mktemp("resume")
    lora = make_random_lora.make_random_lora(root / "lora", seed=5, **TINY_LORA)
    a, empty = root / "a", root / "empty"
    for args in (("init",), ("import", "base", tiny_model["gguf"], "--name", "tiny"),
                 ("import", "adapter", lora, "--name", "demo"), ("activate", "tiny", "demo@0.9")):
        assert _slm("--store", a, *args).returncode == 0
    ref = f"{registry.host}/resume/tiny:v1"
    assert _slm("--store", a, "push", ref).returncode == 0
    assert _slm("--store", empty, "init").returncode == 0
    full = root / "full"
    shutil.copytree(empty, full)
    fresh = _pull_json(full, ref)
    traced = root / "traced"
    shutil.copytree(empty, traced)
    trace = _slm("--store", traced, "pull", ref, env={"SLM_FAULTS": "trace"}).stderr.splitlines()
    kept = [int(line.split()[2]) for line in trace
            if line.startswith("slm-fault op ") and " rename " in line and "/tmp/pull-" in line.split(" -> ")[-1]]
    assert len(kept) > 10, "the pull streams the tensors it keeps"
    return {"ref": ref, "empty": empty, "fresh": fresh, "half_op": kept[len(kept) // 2] + 1, "root": root}


def _crashed_half_way(world, store: Path) -> Path:
    """The empty store after a pull killed half-way through its layers: its staging area."""
    shutil.copytree(world["empty"], store)
    r = _slm("--store", store, "pull", world["ref"], env={"SLM_FAULTS": f"crash@op={world['half_op']}"})
    assert r.returncode == 86, r.stderr
    (area,) = (store / "tmp").iterdir()
    assert area.name == "pull-" + world["fresh"]["manifest_digest"].removeprefix("sha256:")
    return area


def _kept(area: Path) -> list[Path]:
    return sorted(p for p in area.iterdir() if len(p.name) == 64)


def _clean_after(store: Path) -> None:
    r = _slm("--store", store, "fsck")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not any((store / "tmp").iterdir())  # the staging goes with the pull that commits it


def test_a_pull_killed_half_way_then_pulled_again_downloads_only_what_it_lacked(tmp_path, world):
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    kept = _kept(area)
    kept_bytes = sum(p.stat().st_size for p in kept)
    assert _slm("--store", store, "fsck").returncode == 0  # a young staging is not junk
    got = _pull_json(store, world["ref"])
    fresh = world["fresh"]
    print(f"re-pull after a crash at half: {got['bytes_downloaded']} of {fresh['bytes_downloaded']} bytes "
          f"downloaded again, {got['bytes_resumed']} resumed ({got['blobs_resumed']} blobs)")
    assert got["composition_id"] == fresh["composition_id"]
    assert got["blobs_resumed"] == len(kept) and got["bytes_resumed"] == kept_bytes
    assert got["blobs_downloaded"] == fresh["blobs_downloaded"] - len(kept)
    assert got["bytes_downloaded"] == fresh["bytes_downloaded"] - kept_bytes
    _clean_after(store)
    assert _slm("--store", store, "activate", got["composition_id"]).returncode == 0


@pytest.mark.hostile
def test_a_corrupted_planted_or_linked_kept_blob_is_downloaded_again(tmp_path, world, registry):  # noqa: F811
    """tmp/ is writable by whoever can write the store: a kept blob whose bytes changed, a file
    planted under the digest of a blob the pull never received, and a hard link (its bytes
    right, but another name can change them after the check) are each downloaded again."""
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    kept = _kept(area)
    corrupt, linked = kept[0], kept[1]
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2] ^= 0x01
    corrupt.write_bytes(bytes(data))
    os.link(linked, tmp_path / "another-name")
    planted = _layers_not_kept(world, registry, kept)[0]
    (area / planted["annotations"]["org.slm.blake3"].removeprefix("blake3:")).write_bytes(b"planted")
    got = _pull_json(store, world["ref"])
    assert got["blobs_resumed"] == len(kept) - 2
    assert got["blobs_downloaded"] == world["fresh"]["blobs_downloaded"] - len(kept) + 2
    _clean_after(store)  # fsck re-hashes every blob: what the pull committed is right


def _layers_not_kept(world, registry, kept: list[Path]) -> list[dict]:  # noqa: F811
    """The manifest's layers a half-way pull had not received."""
    names = {p.name for p in kept}
    manifest = json.loads(registry.blob_path(world["fresh"]["manifest_digest"]).read_bytes())
    return [l for l in manifest["layers"] if l["annotations"]["org.slm.blake3"].removeprefix("blake3:") not in names]


@pytest.mark.hostile
def test_a_refused_pull_leaves_the_store_as_it_was_before_the_interrupted_one(tmp_path, world, registry):  # noqa: F811
    """A pull interrupted half-way, then refused (a blob it had not received is tampered with in
    the registry): exit 5, and the store is byte for byte the one before the first pull, the
    kept staging removed with the refusal."""
    store = tmp_path / "s"
    before = snapshot(world["empty"])
    layer = _layers_not_kept(world, registry, _kept(_crashed_half_way(world, store)))[-1]
    victim = registry.blob_path(layer["digest"])
    original = victim.read_bytes()
    try:
        victim.write_bytes(original[:-1] + bytes([original[-1] ^ 0x01]))
        r = _slm("--store", store, "pull", world["ref"])
    finally:
        victim.write_bytes(original)
    assert r.returncode == 5, r.stderr
    assert snapshot(store) == before


def test_two_pulls_of_one_manifest_never_share_its_staging(tmp_path, world):
    """A second pull of the manifest while the first holds its staging is refused (exit 7)
    before it writes anything; the first completes, the store clean."""
    store = tmp_path / "s"
    shutil.copytree(world["empty"], store)
    first = subprocess.Popen([sys.executable, "-m", "slm", "--store", str(store), "pull", world["ref"], "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "SLM_FAULTS": "pause@point=bundle.staged",
                                  "SLM_FAULTS_PAUSE_S": "10"})
    try:
        for line in first.stderr:
            if "slm-fault paused bundle.staged" in line:
                break
        second = _slm("--store", store, "pull", world["ref"])
        assert second.returncode == 7, second.stderr
        assert "another pull of the same manifest" in second.stderr
    finally:
        out, _ = first.communicate(timeout=300)
    assert first.returncode == 0
    assert json.loads(out)["composition_id"] == world["fresh"]["composition_id"]
    _clean_after(store)


def test_fsck_and_gc_remove_a_staging_abandoned_for_a_day(tmp_path, world):
    """A kept staging is left alone by `fsck --repair` and `gc` while it is younger than a day;
    older, fsck reports it as junk and --repair removes it; `gc --prune-now` removes it at once."""
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    assert _slm("--store", store, "fsck", "--repair").returncode == 0
    assert _slm("--store", store, "gc").returncode == 0
    assert area.is_dir()
    old = time.time() - DAY - 60
    os.utime(area, (old, old))
    r = _slm("--store", store, "fsck")
    assert r.returncode == 9 and f"tmp/{area.name}" in r.stdout, r.stdout
    assert _slm("--store", store, "fsck", "--repair").returncode == 0
    assert not area.exists()

    store2 = tmp_path / "s2"
    area = _crashed_half_way(world, store2)
    plan = json.loads(_slm("--store", store2, "gc", "--prune-now", "--json").stdout)
    assert plan["pull_stagings"] == [area.name]
    assert not area.exists()
    _clean_after(store2)
