"""Attacks on the resumable pull's staging (tmp/pull-<manifest hex>/) from whoever can write
tmp/: what is planted there is never followed, opened blocking, removed outside the store, or
committed unverified; a pull still downloads what it cannot trust."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dist_fixtures import registry  # noqa: F401  (fixture)
from test_dist_resume import _clean_after, _crashed_half_way, _kept, _pull_json, _slm, world  # noqa: F401

pytestmark = pytest.mark.hostile


def test_a_staging_others_can_write_is_not_resumed_from(tmp_path, world):  # noqa: F811
    """The area's name is predictable: one who can write tmp/ can make it (or leave it) a
    directory others can write, and swap a kept blob there after the pull re-hashed it. Nothing
    is reused from such an area; the pull replaces it with one of its own."""
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    assert _kept(area)
    os.chmod(area, 0o777)
    got = _pull_json(store, world["ref"])
    assert got["blobs_resumed"] == 0
    assert got["blobs_downloaded"] == world["fresh"]["blobs_downloaded"]
    _clean_after(store)


def test_a_staging_planted_as_a_symlink_is_not_followed(tmp_path, world):  # noqa: F811
    """tmp/pull-<hex> planted as a symlink to a directory outside the store holding a blob's
    name: the pull neither reads nor removes anything there."""
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    outside = tmp_path / "outside"
    shutil.move(str(area), str(outside))
    victims = sorted(p.name for p in outside.iterdir())
    area.symlink_to(outside, target_is_directory=True)
    got = _pull_json(store, world["ref"])
    assert got["blobs_resumed"] == 0
    assert sorted(p.name for p in outside.iterdir()) == victims
    _clean_after(store)


def test_a_fifo_directory_or_symlink_under_a_blobs_name_is_downloaded_again(tmp_path, world):  # noqa: F811
    """Kept blobs replaced by a FIFO (never opened blocking: the pull would hang), a directory,
    and a symlink to a file outside the store: each is downloaded again, the outside file kept."""
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    kept = _kept(area)
    fifo, directory, link = kept[0], kept[1], kept[2]
    outside = tmp_path / "outside-blob"
    outside.write_bytes(link.read_bytes())
    for p in (fifo, directory, link):
        p.unlink()
    os.mkfifo(fifo)
    directory.mkdir()
    (directory / "x").write_bytes(b"x")
    link.symlink_to(outside)
    got = _pull_json(store, world["ref"])
    assert got["blobs_resumed"] == len(kept) - 3
    assert outside.is_file() and stat.S_ISREG(outside.lstat().st_mode)
    _clean_after(store)


def test_a_sparse_kept_blob_of_another_size_is_not_read(tmp_path, world):  # noqa: F811
    """A kept blob truncated up to a huge sparse size: refused by its size before a byte of it
    is hashed, and downloaded again."""
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    kept = _kept(area)
    os.truncate(kept[0], 1 << 40)
    got = _pull_json(store, world["ref"])
    assert got["blobs_resumed"] == len(kept) - 1
    _clean_after(store)


def test_thousands_of_leftovers_in_the_staging_are_cleared(tmp_path, world):  # noqa: F811
    """Files planted in the area under names that are no digest are removed when the next pull
    claims it (they are the leftovers of a blob cut off mid-way), and the pull resumes the rest."""
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    kept = _kept(area)
    for i in range(3000):
        (area / f"junk-{i}").write_bytes(b"")
    got = _pull_json(store, world["ref"])
    assert got["blobs_resumed"] == len(kept)
    _clean_after(store)


@pytest.mark.parametrize("which", ["kept", "downloaded"])
def test_a_staged_blob_swapped_before_commit_never_lands_in_objects(tmp_path, world, which):  # noqa: F811
    """Commit links each staged blob into objects/ by its name in the area, after the pull
    verified it (a kept blob re-hashed, a downloaded one hashed as it arrived): another file
    renamed over that name in between (the same size, other bytes) must not become the blob.
    The pull is refused (exit 5), and the store holds no corrupt blob."""
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    kept = _kept(area)
    victim = kept[0] if which == "kept" else None
    planted = tmp_path / "planted"
    pull = subprocess.Popen([sys.executable, "-m", "slm", "--store", str(store), "pull", world["ref"]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SLM_FAULTS": "pause@point=bundle.staged",
                                 "SLM_FAULTS_PAUSE_S": "5"})
    try:
        for line in pull.stderr:
            if "slm-fault paused bundle.staged" in line:
                break
        victim = victim or next(p for p in _kept(area) if p not in kept and p.stat().st_size > 0)
        planted.write_bytes(bytes(victim.stat().st_size))
        os.replace(planted, victim)
    finally:
        _, err = pull.communicate(timeout=300)
    fsck = _slm("--store", store, "fsck")
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    assert pull.returncode == 5 and "replaced" in err, err


@pytest.mark.parametrize("plant", ["symlink", "directory", "fifo"])
def test_a_planted_lock_neither_blocks_nor_breaks_pull_gc_or_fsck(tmp_path, world, plant):  # noqa: F811
    """The area's .lock planted as a symlink to a file outside the store, a directory or a FIFO:
    the next pull still completes, and gc --prune-now / fsck --repair still remove such an area
    once abandoned; the file outside is untouched."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep me")
    stores = []
    for name in ("pulled", "collected", "repaired"):
        store = tmp_path / name
        area = _crashed_half_way(world, store)
        lock = area / ".lock"
        lock.unlink()
        {"symlink": lambda: lock.symlink_to(outside), "directory": lock.mkdir,
         "fifo": lambda: os.mkfifo(lock)}[plant]()
        stores.append((store, area))
    (pulled, _), (collected, c_area), (repaired, r_area) = stores
    got = _pull_json(pulled, world["ref"])
    assert got["composition_id"] == world["fresh"]["composition_id"]
    _clean_after(pulled)
    r = _slm("--store", collected, "gc", "--prune-now")
    assert r.returncode == 0, r.stderr
    assert not c_area.exists()
    old = time.time() - 2 * 24 * 3600
    os.utime(r_area, (old, old))
    r = _slm("--store", repaired, "fsck", "--repair")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not r_area.exists()
    assert outside.read_bytes() == b"keep me"


def test_gc_and_fsck_repair_leave_a_live_pulls_staging_alone(tmp_path, world):  # noqa: F811
    """`gc --prune-now` and `fsck --repair` (the staging aged past a day) while a pull holds its
    staging, resumed and about to commit: the staging stays, and the pull completes."""
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    pull = subprocess.Popen([sys.executable, "-m", "slm", "--store", str(store), "pull", world["ref"], "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SLM_FAULTS": "pause@point=bundle.staged",
                                 "SLM_FAULTS_PAUSE_S": "10"})
    try:
        for line in pull.stderr:
            if "slm-fault paused bundle.staged" in line:
                break
        old = time.time() - 2 * 24 * 3600
        os.utime(area, (old, old))
        gc = _slm("--store", store, "gc", "--prune-now")
        fsck = _slm("--store", store, "fsck", "--repair")
        assert area.is_dir() and _kept(area)
    finally:
        out, err = pull.communicate(timeout=300)
    assert pull.returncode == 0, err
    assert gc.returncode == 0 and fsck.returncode == 0, gc.stderr + fsck.stdout + fsck.stderr
    assert json.loads(out)["composition_id"] == world["fresh"]["composition_id"]
    _clean_after(store)


def test_a_staging_planted_as_a_fifo_is_not_opened(tmp_path, world):  # noqa: F811
    """tmp/pull-<hex> planted as a FIFO (opening it would block the pull): removed, the pull
    downloads everything and completes."""
    store = tmp_path / "s"
    area = _crashed_half_way(world, store)
    shutil.rmtree(area)
    os.mkfifo(area)
    got = _pull_json(store, world["ref"])
    assert got["blobs_resumed"] == 0
    assert got["blobs_downloaded"] == world["fresh"]["blobs_downloaded"]
    _clean_after(store)
