"""kill -9 of a follower at every step of a round (docs/fleet.md): a device runs version 1,
marked good; the tag moves to version 2; the device's round (`python -m slm follow REF --once`,
a real process) is crashed at a step. Then the follower restarts (repairing what the store
needs itself) and `slm fsck` runs (--repair for the junk a crash leaves in tmp/): the device
must run the old good composition or the new one marked good, with no trial pending, and fsck
must be clean. Before the restart, the active composition is one the follower's state records.

The steps: the round's own points (follow.*), the pull's and the activation's protocol points
(crash@op at each point the round passes: SLM_FOLLOW_CRASH_EVERY_OP=1 sweeps every fs operation
instead), a real SIGKILL from outside while a health.d script runs, and a composition whose
health check kills the follower each time: it dies max_trial_deaths times, then is rolled back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomlkit

import follow_fixtures as ff
from dist_fixtures import registry  # noqa: F401  (fixture)
from slm.store.testing.faults import CRASH_EXIT_CODE

pytestmark = [pytest.mark.durability, pytest.mark.slow]

ROUND_TIMEOUT_S = 180  # a hang guard only: a round takes seconds
FOLLOW_POINTS = ["follow.resolved", "follow.pulled", "follow.staged", "follow.activated", "follow.checked",
                 "follow.marked"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_model, registry):  # noqa: F811
    return ff.build(tmp_path_factory.mktemp("follow-crash"), tiny_model, registry.host)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SLM_FAULTS"}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**env, **extra}


def _round(store: Path, fleet, **env) -> subprocess.CompletedProcess:
    """The device's round as its own process (subprocess.run kills it at the timeout)."""
    return subprocess.run([sys.executable, "-m", "slm", "--store", str(store), "follow", fleet.ref, "--once",
                           "--insecure"], env=_env(**env), capture_output=True, text=True, timeout=ROUND_TIMEOUT_S)


def _recovered(cli, fleet, store: Path) -> ff.Outcome:
    """Restart the follower (it repairs an interrupted store itself), then `slm fsck` (and
    --repair when it asks): the device settled on v1 or v2, each as marked, and fsck clean."""
    r = cli("--store", store, "follow", fleet.ref, "--once", "--insecure")
    assert r.code in (0, 18), (r.code, r.err)
    status = cli("--store", store, "follow", "--status", "--json").json()
    assert status["trial"] is None, status["trial"]
    assert status["good"] is not None and status["good"]["composition"] == status["active"], status
    fsck = cli("--store", store, "fsck", "--json")
    if fsck.code != 0:  # the follower repairs what the store needs; junk in tmp/ waits for fsck
        assert {f["problem"] for f in fsck.json()["findings"]} == {"junk"}, fsck.out
        assert cli("--store", store, "fsck", "--repair").code == 0
        fsck = cli("--store", store, "fsck")
        assert fsck.code == 0, fsck.out + fsck.err
    state = ff.outcome(store)
    assert state.settled(), ff.short(fleet, state)
    expected = fleet.v2 if r.code == 0 else fleet.v1  # 18: v2 was marked bad, v1 runs again
    assert state.good == expected, ff.short(fleet, state)
    return state


def _crashed(fleet, store: Path, spec: str) -> ff.Outcome:
    r = _round(store, fleet, SLM_FAULTS=spec)
    assert r.returncode == CRASH_EXIT_CODE, (spec, r.returncode, r.stderr[-2000:])
    state = ff.outcome(store)
    assert not ff.accounted(fleet, state), ff.short(fleet, state)
    return state


def _trace(fleet, store: Path, points=FOLLOW_POINTS) -> list[tuple[int, str, str]]:
    """The round's fs operations and named points, in order: [(op index, 'op'|'point', detail)]."""
    r = _round(store, fleet, SLM_FAULTS="trace")
    assert r.returncode in (0, 18), r.stderr[-2000:]
    events, count = [], 0
    for line in r.stderr.splitlines():
        if line.startswith("slm-fault op "):
            count = int(line.split()[2])
            events.append((count, "op", line.split(None, 3)[3]))
        elif line.startswith("slm-fault point "):
            events.append((count + 1, "point", line.split()[2]))  # the op it comes before
    assert {d for _, kind, d in events if kind == "point"} >= set(points)
    return events


@pytest.fixture(scope="module")
def round_trace(fleet, tmp_path_factory):
    return _trace(fleet, fleet.device(tmp_path_factory.mktemp("trace")))


@pytest.mark.parametrize("point", FOLLOW_POINTS)
def test_kill_at_each_step_of_a_round_then_restart(cli, fleet, tmp_path, point):
    store = fleet.device(tmp_path)
    crashed = _crashed(fleet, store, f"crash@point={point}")
    if point in ("follow.staged", "follow.activated", "follow.checked"):
        assert crashed.trial == fleet.v2, ff.short(fleet, crashed)  # the trial is recorded first
    state = _recovered(cli, fleet, store)
    assert state.active == fleet.v2 and state.bad == (), ff.short(fleet, state)  # resumed, passed


@pytest.mark.parametrize("point", ["follow.activated", "follow.checked"])
def test_kill_mid_trial_then_fsck_repair_first_rolls_it_back(cli, fleet, tmp_path, point):
    """`slm fsck --repair` before any follower restarts: the trial nobody runs is undone and
    marked bad; the follower then keeps the good one (18: the tag names a bad composition)."""
    store = fleet.device(tmp_path)
    _crashed(fleet, store, f"crash@point={point}")
    assert cli("--store", store, "fsck").code != 0, "fsck did not see the pending trial"
    assert cli("--store", store, "fsck", "--repair").code == 0
    repaired = ff.outcome(store)
    assert repaired.settled() and repaired.good == fleet.v1 and repaired.bad == (fleet.v2,), \
        ff.short(fleet, repaired)
    state = _recovered(cli, fleet, store)
    assert state.bad == (fleet.v2,)


def _sweep(events) -> list[int]:
    """The ops to crash before: every one (SLM_FOLLOW_CRASH_EVERY_OP=1), else the first op
    after each named point the round passes (the pull's bundle.*, the journal's, the reflog's
    and refs/active's points of each transaction, the follower's own)."""
    if os.environ.get("SLM_FOLLOW_CRASH_EVERY_OP"):
        return sorted({op for op, kind, _ in events if kind == "op"})
    ops = {op for op, kind, _ in events if kind == "op"}
    return sorted({op for op, kind, _ in events if kind == "point" and op in ops})


def test_kill_at_every_protocol_point_of_a_round(cli, fleet, round_trace, tmp_path):
    ops = _sweep(round_trace)
    assert len(ops) > 15, ops
    failures = []
    for op in ops:
        store = fleet.device(tmp_path / f"op{op}")
        try:
            _crashed(fleet, store, f"crash@op={op}")
            _recovered(cli, fleet, store)
        except AssertionError as err:
            failures.append(f"crash@op={op}: {str(err)[:300]}")
    print(f"\n{len(ops)} crash points of the round")
    assert not failures, "\n".join(failures)


def test_kill_at_every_point_of_a_round_that_rolls_back(cli, fleet, tmp_path):
    """v2 fails its health check (a health.d script exits 1): the round records the failure,
    makes v1 active again, marks v2 bad. Killed at each point from the trial's activation on,
    the restarted follower finishes the roll-back (or runs the failing checks again)."""
    traced = fleet.device(tmp_path / "trace")
    _health_script(traced, "exit 1\n")
    events = _trace(fleet, traced)
    activated = next(op for op, kind, name in events if name == "follow.activated")
    ops = [op for op in _sweep(events) if op >= activated]
    assert len(ops) >= 5, ops
    failures = []
    for op in ops:
        store = fleet.device(tmp_path / f"op{op}")
        _health_script(store, "exit 1\n")
        try:
            _crashed(fleet, store, f"crash@op={op}")
            state = _recovered(cli, fleet, store)
            assert state.bad == (fleet.v2,), ff.short(fleet, state)
        except AssertionError as err:
            failures.append(f"crash@op={op}: {str(err)[:300]}")
    print(f"\n{len(ops)} crash points of the failing trial")
    assert not failures, "\n".join(failures)


@pytest.mark.hostile
def test_a_follower_killed_before_clearing_its_intent_updates_without_an_operator(cli, fleet, tmp_path):
    """Killed after its state's change committed but before the intent was cleared (the last
    journal.before-clear of a first round): the next round clears the intent itself and moves
    the device to v2, with no `slm fsck --repair` in between (a pending intent refuses every
    transaction: the device would never update again)."""
    fleet.publish(1)
    try:
        events = _trace(fleet, fleet.device(tmp_path / "trace", following=False), points=["follow.marked"])
        last_clear = max(op for op, kind, name in events if name == "journal.before-clear")
        store = fleet.device(tmp_path / "case", following=False)
        crashed = _crashed(fleet, store, f"crash@op={last_clear}")
    finally:
        fleet.publish(2)
    assert crashed.settled() and crashed.good == fleet.v1, ff.short(fleet, crashed)
    assert cli("--store", store, "fsck").code == 9, "no intent was left pending"
    r = cli("--store", store, "follow", fleet.ref, "--once", "--insecure")
    assert r.code == 0, r.err
    state = ff.outcome(store)
    assert state.settled() and state.good == fleet.v2, ff.short(fleet, state)
    assert cli("--store", store, "fsck").code == 0


def _health_script(store: Path, body: str) -> None:
    (store / "health.d").mkdir()
    script = store / "health.d" / "check"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)


def _wait_for(path: Path, proc: subprocess.Popen, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s  # a hang guard, not a timed assert
    while not path.exists():
        assert proc.poll() is None, f"the follower ended ({proc.returncode}) before the script started"
        assert time.monotonic() < deadline, "the health script never started"
        time.sleep(0.05)


def test_sigkill_while_a_health_script_runs(cli, fleet, tmp_path):
    """The follower killed from outside while its health.d script sleeps: it restarts, counts
    the death, runs the checks again (the script passes now) and marks v2 good."""
    store = fleet.device(tmp_path)
    started, pid_file = tmp_path / "started", tmp_path / "script.pid"
    _health_script(store, f'echo $$ > "{pid_file}"\n[ -e "{started}" ] && exit 0\n'
                          f'touch "{started}"\nexec sleep 120\n')
    proc = subprocess.Popen([sys.executable, "-m", "slm", "--store", str(store), "follow", fleet.ref, "--once",
                             "--insecure"], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(started, proc)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()
        _kill_script(pid_file)
    mid = ff.outcome(store)
    assert (mid.active, mid.good, mid.trial, mid.deaths) == (fleet.v2, fleet.v1, fleet.v2, 0), ff.short(fleet, mid)
    state = _recovered(cli, fleet, store)
    assert state.active == fleet.v2 and state.bad == ()


def _kill_script(pid_file: Path) -> None:
    """The script outlives a follower killed with SIGKILL (docs/health.md): the test ends it."""
    try:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        pass


@pytest.mark.parametrize("limit", [None, 2])
def test_deaths_during_a_trial_roll_it_back(cli, fleet, tmp_path, limit):
    """A composition whose health check kills the follower (the script SIGKILLs its parent, as
    a composition that crashes its host would): each start finds the trial, counts the death
    and tries again, until max_trial_deaths (default 3); the next start rolls it back to the
    good one and marks it bad, and it is never tried again."""
    store = fleet.device(tmp_path)
    if limit is not None:
        doc = tomlkit.parse((store / "config.toml").read_text())
        doc["follow"] = {"max_trial_deaths": limit}
        (store / "config.toml").write_text(tomlkit.dumps(doc))
    deaths = limit or 3
    _health_script(store, "kill -KILL $PPID\n")
    for died in range(deaths):
        r = _round(store, fleet)
        assert r.returncode == -signal.SIGKILL, (died, r.returncode, r.stderr[-1000:])
        state = ff.outcome(store)
        assert (state.active, state.trial, state.deaths) == (fleet.v2, fleet.v2, died), ff.short(fleet, state)
    r = _round(store, fleet)
    assert r.returncode == 18, r.stderr[-1000:]
    state = ff.outcome(store)
    assert state.settled() and state.good == fleet.v1 and state.bad == (fleet.v2,), ff.short(fleet, state)
    assert f"died {deaths} times" in state.reasons[0]
    again = _round(store, fleet)  # the tag still names v2: known bad, nothing pulled or tried
    assert again.returncode == 18 and "marked bad" in again.stderr, again.stderr[-1000:]
    assert ff.outcome(store) == state
    assert cli("--store", store, "fsck").code == 0
