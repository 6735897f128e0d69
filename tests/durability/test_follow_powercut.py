"""The power-cut simulator over a whole follow round (slm/store/testing/powercut.py), and the
fsync mutation test of the follower's state files.

A device store follows the tag through one round on version 1 (acknowledged: exit 0), the tag
moves to version 2, and the device's second round runs; both in-process under one power-cut
session, so what the first round left unsynced is still at risk. The disk each cut would leave
is recorded before every fs operation of the second round and once after it returned; each
distinct disk is then "rebooted": the follower restarted (it repairs what its store needs
itself), then `slm fsck`; for the disks of the random and torn cuts, `slm fsck --repair` runs
first. What must hold (docs/fleet.md, docs/recovery.md):

  - before any repair, the active composition is the good one or a trial the state records,
    and no intent is damaged (each is fsynced before its name appears);
  - fsck --repair (when it runs first) exits 0, leaves no trial pending, the good composition active;
  - the restarted follower ends on v2 marked good, or (fsck rolled the trial back and marked it
    bad) on v1; fsck then finds nothing but junk in tmp/, and is clean after --repair;
  - a cut right after the round returned (acknowledged) leaves v2 good and active, with
    nothing for fsck to repair.

The mutation test: the follower writes follow/state.json (atomic_replace: the file's data, then
follow/'s entry), creates follow/ (the store root's entry) and journals each change
(journal/follow.intent: its data, journal/'s entry when written and when cleared). These are
fs-layer call sites that scripts/mutate_fsync.py mutates for every user at once; here each fsync
is removed for the follower's files only, and the sweep above must find a violation. One is
not in the list: journal/'s fsync after follow.intent is written. Without it the intent may
vanish in a cut, but the follower's commit is one rename of a whole state file that never
depended on it (follow_state.recover only clears the intent): no cut can tell, and the fs-layer
site is killed through the other transaction kinds (scripts/mutate_fsync.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

import pytest

import durability_matrix as dm
import follow_fixtures as ff
from dist_fixtures import registry  # noqa: F401  (fixture)
from slm.errors import SlmError
from slm.store import fs
from slm.store.testing.disk_image import write_image
from slm.store.testing.powercut import PowerCut

pytestmark = [pytest.mark.durability, pytest.mark.slow]

SEEDS = [int(s) for s in os.environ.get("SLM_DURABILITY_SEEDS", "1").split(",")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_model, registry):  # noqa: F811
    return ff.build(tmp_path_factory.mktemp("follow-powercut"), tiny_model, registry.host)


def _follow(store: Path, fleet):
    import slm

    return slm.Store.open(store).follow(fleet.ref, insecure=True, once=True)


def record(fleet, case: Path, cuts) -> tuple[list, int]:
    """Round 1 (v1) then round 2 (v2) under one session; the images of every cut of round 2
    and the op index that stands for "right after it returned"."""
    case.mkdir(parents=True)
    store = fleet.device(case, following=False)
    fleet.publish(1)
    try:
        with dm.session(PowerCut(case, None, 0, "keep-all")) as sim:
            assert _follow(store, fleet).outcome == "updated"
            fleet.publish(2)
            sim.start_recording(cuts)
            assert _follow(store, fleet).outcome == "updated"
            sim.count += 1  # the instant after the round returned counts as one more cut point
            sim.record_cuts()
    finally:
        fleet.publish(2)
    return sim.recorded, sim.count


def check_recovered(fleet, store: Path, at_end: bool, repair_first: bool) -> list[str]:
    try:
        return _check(fleet, store, at_end, repair_first)
    except SlmError as err:  # a store that cannot even be read
        return [f"the store cannot be recovered: {err}"]


def _fsck(store: Path, repair: bool = False):
    import slm

    return slm.Store.open(store).fsck(repair)


def _findings(store: Path) -> str:
    return "; ".join(f"{f.problem}: {f.what}" for f in _fsck(store).findings)


def _check(fleet, store: Path, at_end: bool, repair_first: bool) -> list[str]:
    if not (store / "config.toml").is_file():
        return ["the store is gone"]
    state = ff.outcome(store)
    problems = ff.accounted(fleet, state)
    findings = _fsck(store).findings
    # an intent is fsynced before its name appears: a cut leaves it whole or absent
    problems += [f"a damaged intent: {f.what}" for f in findings if "damaged intent" in f.what]
    if at_end:
        if (state.active, state.good, state.trial) != (fleet.v2, fleet.v2, None):
            problems.append(f"a cut after the round returned lost it: {ff.short(fleet, state)}")
        needs = [f for f in findings if f.problem != "junk"]
        if needs:
            problems.append("a cut after the round returned needs a repair: "
                            + "; ".join(f"{f.problem}: {f.what}" for f in needs))
    if repair_first:
        if _fsck(store, repair=True).exit_code != 0:
            return problems + ["fsck --repair did not exit 0: " + _findings(store)]
        repaired = ff.outcome(store)
        if not repaired.settled() or repaired.good not in (fleet.v1, fleet.v2):
            return problems + [f"after fsck --repair: {ff.short(fleet, repaired)}"]
    round_ = _follow(store, fleet)  # the follower restarts (and repairs what its store needs)
    state = ff.outcome(store)
    expected = fleet.v2 if round_.ok else fleet.v1  # not ok: fsck marked v2 bad, v1 runs again
    if not state.settled() or state.good != expected or (not round_.ok and fleet.v2 not in state.bad):
        problems.append(f"after the follower restarted ({round_.outcome}): {ff.short(fleet, state)}")
    left = [f for f in _fsck(store).findings if f.problem != "junk"]  # junk in tmp/ waits for fsck
    if left or _fsck(store, repair=True).exit_code != 0 or _fsck(store).exit_code != 0:
        problems.append("fsck after the restart is not clean: " + _findings(store))
    return problems


def sweep(fleet, work: Path, cuts, stop_at_first: bool = False,
          recording=contextlib.nullcontext()) -> tuple[int, int, list[str]]:
    """Record (inside `recording`: a mutant's code), then check each distinct disk: (cut cases,
    distinct disks, failures). The cut after the round returned and the drop-all cuts go first
    (what a missing fsync breaks)."""
    with recording:
        recorded, end = record(fleet, work / "rec", cuts)
    order = sorted(recorded, key=lambda c: (c[0] != end, c[1] != "drop-all"))
    seen: dict[tuple, list[str]] = {}
    failures: list[str] = []
    shared = work / "shared-blobs"
    shared.mkdir()
    for i, (op, mode, seed, image) in enumerate(order):
        repair_first = mode in ("random", "torn")  # drop-all, keep-all: the follower alone
        key = (dm.image_key(image), op == end, repair_first)
        if key not in seen:
            case = work / f"c{i}"
            case.mkdir()
            write_image(image, case, shared)
            seen[key] = check_recovered(fleet, case / "store", op == end, repair_first)
            shutil.rmtree(case, ignore_errors=True)
        if seen[key]:
            where = "after the round returned" if op == end else f"before op {op}"
            failures.append(f"power cut {where} ({mode}, seed {seed}): " + "; ".join(seen[key]))
            if stop_at_first:
                break
    return len(recorded), len(seen), failures


def test_power_cut_at_every_operation_of_a_round(fleet, tmp_path):
    started = time.monotonic()
    cases, distinct, failures = sweep(fleet, tmp_path, dm.cuts_for(SEEDS))
    print(f"\n{cases} cut cases, {distinct} distinct disks recovered in {time.monotonic() - started:.0f}s")
    assert not failures, "\n".join(failures[:10])
    assert distinct > 10, "the cuts left too few different disks: the simulator dropped nothing"


def _is_dir(fd: int) -> bool:
    import stat

    return stat.S_ISDIR(os.fstat(fd).st_mode)


@contextlib.contextmanager
def without_fsync(monkeypatch, mutant: str):
    """The follower's code with one fsync removed (for its files only): neither the syscall
    nor the simulator's notice of it happens."""
    real_fsync, real_mkdir = fs._fsync, fs.mkdir
    real_replace, real_remove = fs.atomic_replace, fs.remove_any
    inside: list[str] = []  # the names atomic_replace / remove_any are writing or removing now

    def removed(fd: int, path: Path) -> bool:
        if mutant == "state-data":
            return path.parent.name == "follow" and "state.json" in path.name and not _is_dir(fd)
        if mutant == "state-dir":
            return path.name == "follow" and _is_dir(fd)
        if mutant == "intent-data":
            return path.parent.name == "journal" and "follow.intent" in path.name and not _is_dir(fd)
        if mutant in ("intent-dir-written", "intent-dir-cleared"):
            wanted = "replace" if mutant == "intent-dir-written" else "remove"
            return inside[-1:] == [f"{wanted} follow.intent"] and _is_dir(fd)
        return False

    def fsync(fd, path):
        if not removed(fd, Path(path)):
            real_fsync(fd, path)

    def mkdir(path, *, sync_parent=True):
        return real_mkdir(path, sync_parent=sync_parent and not (mutant == "root-dir" and path.name == "follow"))

    def replace(path, data, mode=0o644):
        inside.append(f"replace {path.name}")
        try:
            return real_replace(path, data, mode)
        finally:
            inside.pop()

    def remove(path):
        inside.append(f"remove {path.name}")
        try:
            return real_remove(path)
        finally:
            inside.pop()

    with monkeypatch.context() as m:
        m.setattr(fs, "_fsync", fsync)
        m.setattr(fs, "mkdir", mkdir)
        m.setattr(fs, "atomic_replace", replace)
        m.setattr(fs, "remove_any", remove)
        yield


MUTANTS = ["state-data", "state-dir", "root-dir", "intent-data", "intent-dir-cleared"]


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_fsync_of_the_follower_is_needed(fleet, tmp_path, monkeypatch, mutant):
    _, _, failures = sweep(fleet, tmp_path, dm.cuts_for(SEEDS), stop_at_first=True,
                           recording=without_fsync(monkeypatch, mutant))
    assert failures, f"no power cut found the follower's {mutant} fsync missing"
    print(f"\n{mutant}: killed by {failures[0][:300]}")
