"""The power-cut simulator itself (slm/store/testing/powercut.py): its model of what survives a cut,
that a cut replays exactly from its printed spec, and that the matrix's recorded cuts are the
disks real cuts leave."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import durability_matrix as dm
from helpers import ADVISORY
from slm.errors import UsageError
from slm.store import fs
from slm.store.testing import faults
from slm.store.journal import Journal
from slm.store.testing.powercut import CUT_EXIT_CODE, PowerCut, PowerCutHappened

pytestmark = pytest.mark.durability


def _image(root: Path, work, mode: str = "drop-all", seed: int = 0) -> dict:
    """Run `work` under a session over `root`, cut right after it, return {path: bytes|None}."""
    sim = PowerCut(root, None, seed, mode)
    faults.install(sim)
    try:
        work()
    finally:
        faults.install(None)
    sim.cut_now()
    return sim.image.flat()


def _new_file(path: Path, data: bytes, sync: bool = True) -> None:
    with fs.NewFile(path) as f:
        f.write(data)
        if sync:
            f.sync_and_close()


def test_fsync_of_a_file_makes_its_data_durable_not_its_name(tmp_path):
    (tmp_path / "d").mkdir()
    got = _image(tmp_path, lambda: _new_file(tmp_path / "d" / "f", b"x" * 5000))
    assert "d/f" not in got, "the directory was never synced: the name is not durable"
    got = _image(tmp_path, lambda: fs.fsync_dir(tmp_path / "d"))
    assert got["d/f"] == b"x" * 5000, "data fsynced, then the directory: both durable"


def test_a_name_made_durable_before_its_data_may_come_back_empty(tmp_path):
    (tmp_path / "d").mkdir()

    def work():
        _new_file(tmp_path / "d" / "f", b"y" * 9000, sync=False)
        fs.fsync_dir(tmp_path / "d")
    assert _image(tmp_path, work)["d/f"] == b""


def test_an_unsynced_rename_may_be_lost_and_its_data_torn(tmp_path):
    """The ALICE case: write a temp file, rename it over the old one, sync nothing."""
    (tmp_path / "ref").write_bytes(b"old" * 3000)

    def work():
        _new_file(tmp_path / "tmp", b"new" * 3000, sync=False)
        fs.rename(tmp_path / "tmp", tmp_path / "ref")
    assert _image(tmp_path, work, "drop-all")["ref"] == b"old" * 3000
    (tmp_path / "ref").write_bytes(b"old" * 3000)
    assert _image(tmp_path, work, "keep-all")["ref"] == b"new" * 3000
    outcomes = set()
    for seed in range(40):
        (tmp_path / "ref").write_bytes(b"old" * 3000)
        image = _image(tmp_path, work, "torn", seed)
        assert "tmp" not in image, "the temp name was never durable"
        got = image["ref"]
        outcomes.add("old" if got == b"old" * 3000 else "new" if got == b"new" * 3000 else
                     "empty" if got == b"" else "torn")
    assert {"old", "empty", "torn"} <= outcomes, outcomes


def test_a_new_directory_needs_its_parent_synced(tmp_path):
    def work():
        fs.mkdir(tmp_path / "sub", sync_parent=False)
        _new_file(tmp_path / "sub" / "f", b"z")
        fs.fsync_dir(tmp_path / "sub")
    assert "sub" not in _image(tmp_path, work)
    fs.remove_tree(tmp_path / "sub")

    def synced():
        fs.mkdir(tmp_path / "sub")
        _new_file(tmp_path / "sub" / "f", b"z")
        fs.fsync_dir(tmp_path / "sub")
    assert _image(tmp_path, synced)["sub/f"] == b"z"


def test_keep_all_is_the_disk_as_it_is_and_an_unsynced_unlink_may_be_undone(tmp_path):
    (tmp_path / "a").write_bytes(b"durable")
    (tmp_path / "b").write_bytes(b"also")

    def work():
        fs.unlink(tmp_path / "a")
        _new_file(tmp_path / "c", b"new", sync=False)
    assert _image(tmp_path, work, "keep-all") == {"b": b"also", "c": b"new"}
    (tmp_path / "a").write_bytes(b"durable")
    (tmp_path / "c").unlink()
    assert _image(tmp_path, work, "drop-all") == {"a": b"durable", "b": b"also"}


def _tree(root: Path) -> dict:
    from slm.store.testing.disk_image import stable_path

    return {stable_path(str(p.relative_to(root))): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*"))}


def test_a_cut_stops_the_process_and_replays_exactly_from_the_printed_spec(tmp_path):
    """Through the real hook: SLM_FAULTS=powercut@... in a child `slm init`. The child exits
    86 and prints the spec; the same spec on a fresh directory leaves the same disk, byte for
    byte (init writes no time)."""
    def cut(where: Path, spec: str):
        where.mkdir()
        env = {**os.environ, "SLM_FAULTS": spec.replace("ROOT", str(where))}
        return subprocess.run([sys.executable, "-m", "slm", "--store", str(where / "store"), "init"],
                              env=env, capture_output=True, text=True)
    spec = "powercut@op=9:seed=7:mode=random:root=ROOT"
    first = cut(tmp_path / "one", spec)
    assert first.returncode == CUT_EXIT_CODE, first.stderr
    printed = first.stderr.strip().splitlines()[-1].split("SLM_FAULTS=", 1)[1]
    assert printed == spec.replace("ROOT", str(tmp_path / "one"))
    second = cut(tmp_path / "two", spec)
    assert second.returncode == CUT_EXIT_CODE
    assert _tree(tmp_path / "one") == _tree(tmp_path / "two")
    other = cut(tmp_path / "three", spec.replace("seed=7", "seed=8").replace("op=9", "op=12"))
    assert other.returncode == CUT_EXIT_CODE
    assert _tree(tmp_path / "three") != _tree(tmp_path / "one"), "another cut, another disk"


@pytest.fixture(scope="module")
def matrix_template(tmp_path_factory, tiny_model):
    return dm.build_template(tmp_path_factory.mktemp("powercut"), tiny_model)


def _scenario(t, name):
    return next(s for s in dm.scenarios(t) if s.name == name)


def test_a_recorded_cut_is_the_disk_a_real_cut_leaves(matrix_template, tmp_path):
    """The matrix records every cut in one run instead of stopping at each; a real cut at the
    same op, mode and seed (a replay) must leave the same disk."""
    scenario = _scenario(matrix_template, "activate")
    rec = dm.record(scenario, matrix_template, tmp_path / "rec", dm.cuts_for([3]))
    ops = sorted({op for op, *_ in rec.cuts})
    for op, mode, seed, image in rec.cuts:
        if op not in (ops[0], ops[len(ops) // 2], ops[-3], ops[-1]):
            continue
        real = dm.replay(scenario, matrix_template, tmp_path / f"cut-{op}-{mode}", op, mode, seed)
        assert _run_independent(real.flat()) == _run_independent(image.flat()), (op, mode, seed)


def _run_independent(flat: dict) -> dict:
    """A disk image but the advisory verified-digest cache, whose records name the inodes and
    times of one run's files (no two runs write the same bytes there; nothing depends on it)."""
    return {path: data for path, data in flat.items() if path not in {f"store/{a}" for a in ADVISORY}}


def test_a_failing_case_prints_a_replay_that_reproduces_it(matrix_template, tmp_path, monkeypatch):
    """A store bug planted on purpose (the journal's intent removal without its directory
    fsync): the matrix fails and prints SLM_POWERCUT_REPLAY=...; replaying that cut gives the
    very same disk and the very same violation."""
    def end_without_fsync(self, intent):
        fs.unlink(self.root / f"{intent.name}.intent")
    monkeypatch.setattr(Journal, "end", end_without_fsync)
    scenario = _scenario(matrix_template, "rollback")
    outcome = dm.run_scenario(scenario, matrix_template, tmp_path / "matrix", dm.cuts_for([1]),
                              stop_at_first=True)
    assert outcome.failures, "the planted bug was not found"
    line = outcome.failures[0]
    printed = line.split("SLM_POWERCUT_REPLAY=", 1)[1].split(")", 1)[0]
    name, op, mode, seed = dm.parse_replay(printed)
    assert name == "rollback"
    rec = dm.record(scenario, matrix_template, tmp_path / "rec", [])
    images = [dm.replay(scenario, matrix_template, tmp_path / f"replay{i}", op, mode, seed) for i in (1, 2)]
    assert images[0].flat() == images[1].flat()
    with dm.frozen_clock():
        problems = dm.check_recovered(tmp_path / "replay1" / "store", rec, op == rec.last_op + 1)
    assert dm.failure_line(scenario, op, mode, seed, rec, problems) == line


def test_the_matrix_catches_a_reflog_rewrite_gc_does_not_make_durable(matrix_template, tmp_path, monkeypatch):
    """gc's retention rewrites logs/active, then removes what only the dropped lines reached.
    The gc-retention scenario really drops lines (6 -> 1), and a rewrite planted without the
    fsync of logs/ (its rename may be lost while the removals that follow are durable) fails
    the matrix: a log naming compositions that are gone."""
    from slm.store import reflog
    from slm.store.reflog import Reflog

    scenario = _scenario(matrix_template, "gc-retention")
    rec = dm.record(scenario, matrix_template, tmp_path / "rec", [])
    assert (len(rec.before[1]), len(rec.after[1])) == (6, 1)

    def rewrite_without_dir_fsync(self, entries):
        tmp = fs.temp_name(self.path.parent, self.path.name)
        with fs.NewFile(tmp) as f:
            f.write(b"".join(reflog.encode(e) for e in entries))
            f.sync_and_close()
        fs.rename(tmp, self.path)
    monkeypatch.setattr(Reflog, "rewrite", rewrite_without_dir_fsync)
    outcome = dm.run_scenario(scenario, matrix_template, tmp_path / "matrix", [("drop-all", 0)], stop_at_first=True)
    assert outcome.failures, "the planted bug was not found"
    assert "names" in outcome.failures[0] and "which the store does not have" in outcome.failures[0]


def test_power_cut_spec_errors_are_one_line(tmp_path):
    with pytest.raises(UsageError) as e:
        PowerCut.from_spec("powercut@op=x:seed=1:mode=random:root=/tmp")
    assert "powercut@op=N" in str(e.value)
    with pytest.raises(UsageError) as e:
        PowerCut(tmp_path, 1, 1, "half")
    assert "unknown power-cut mode" in str(e.value)


def test_after_the_cut_nothing_more_reaches_the_disk(tmp_path):
    sim = PowerCut(tmp_path, 2, 0, "keep-all")
    faults.install(sim)
    try:
        _new_file(tmp_path / "a", b"1")  # op 1: create; op 2 (write) is cut
    except PowerCutHappened:
        pass
    else:
        pytest.fail("no cut")
    finally:
        faults.install(None)
    with pytest.raises(PowerCutHappened):
        sim("unlink", str(tmp_path / "a"))
