"""Power cuts at every fs operation of every verb: what fsync made durable survives, the rest
may go, and `slm fsck --repair` always gets back to the old or the new state
(tests/durability/durability_matrix.py says what is checked; docs/recovery.md the model).

In `make test`: drop-all, keep-all, and random and torn with one seed. `make test-durability`
runs more seeds (SLM_DURABILITY_SEEDS=1,2,3) and the fsync mutation test.
A failing case prints SLM_POWERCUT_REPLAY=SCENARIO:op=N:mode=M:seed=S; set it and run
`pytest tests/durability/test_durability.py -k replay` to replay that one cut exactly.
"""

from __future__ import annotations

import os

import pytest

import durability_matrix as dm
import durability_outputs as do

pytestmark = [pytest.mark.durability, pytest.mark.slow]

SEEDS = [int(s) for s in os.environ.get("SLM_DURABILITY_SEEDS", "1").split(",")]
# scripts/mutate_fsync.py: only some modes, stop at the first failing cut, templates built once
MODES = os.environ.get("SLM_DURABILITY_MODES", "all")
FAIL_FAST = bool(os.environ.get("SLM_DURABILITY_FAIL_FAST"))
# quickest first: the mutation test stops at the first failure
NAMES = ["init", "fsck-repair-finish", "fsck-repair-undo", "fsck-repair-quarantine", "fsck-repair-torn",
         "rollback", "activate-first", "activate", "activate-eio", "deactivate", "import-base-fresh", "gc",
         "import-adapter", "import-base", "rm", "tag", "tag-move", "mv", "gc-prune-now", "gc-retention",
         "import-adapter-move"]


@pytest.fixture(scope="module")
def matrix_template(tmp_path_factory, request):
    shared = os.environ.get("SLM_DURABILITY_TEMPLATE")
    if shared:
        return dm.shared_template(shared)
    return dm.build_template(tmp_path_factory.mktemp("durability"), request.getfixturevalue("tiny_model"))


def _scenario(t, name):
    return next(s for s in dm.scenarios(t) if s.name == name)


def test_every_scenario_is_listed(matrix_template):
    assert sorted(s.name for s in dm.scenarios(matrix_template)) == sorted(NAMES)


def test_every_fsync_the_simulator_hears_of_really_ran(matrix_template, tmp_path):
    """The simulator learns of each fsync from fs._fsync, whether or not the syscall ran: here
    the real os.fsync / os.fdatasync calls of a whole activation are counted. Each notification
    follows a real fsync of the same file, and there is no fsync it was not told of (every one
    goes through the fs layer)."""
    events = do.fsyncs_of_an_activation(matrix_template, tmp_path / "case")
    synced = [f for kind, f in events if kind == "synced"]
    heard = [f for kind, f in events if kind == "heard"]
    assert heard, "the activation made nothing durable"
    assert len(synced) == len(heard), f"{len(synced)} real fsyncs, {len(heard)} told to the simulator"
    unsynced = [i for i, (kind, f) in enumerate(events) if kind == "heard" and events[i - 1] != ("synced", f)]
    assert unsynced == [], "the simulator was told of an fsync that did not run"


@pytest.mark.parametrize("name", [c.name for c in do.output_cases()])
def test_power_cut_keeps_a_reported_output(matrix_template, tmp_path, name):
    """Files slm writes where a user asks (slm/store/outputs.py): once the command returned, the
    output survives a cut; before, its name shows the old state or the whole output."""
    case = next(c for c in do.output_cases() if c.name == name)
    cuts = [c for c in dm.cuts_for(SEEDS) if MODES == "all" or c[0] in MODES.split(",")]
    checked, failures = do.run_output_case(case, matrix_template, tmp_path, cuts, stop_at_first=FAIL_FAST)
    print(f"\n{name}: {checked} cut cases")
    assert not failures, "\n".join(failures[:10])
    assert checked > len(cuts), f"{name} did no fs operation"


@pytest.mark.parametrize("name", NAMES)
def test_power_cut_at_every_operation(matrix_template, tmp_path, name):
    scenario = _scenario(matrix_template, name)
    cuts = [c for c in dm.cuts_for(SEEDS) if MODES == "all" or c[0] in MODES.split(",")]
    outcome = dm.run_scenario(scenario, matrix_template, tmp_path, cuts, stop_at_first=FAIL_FAST)
    per_mode = ", ".join(f"{m} {n}" for m, n in outcome.cases.items())
    print(f"\n{name}: {per_mode} cut cases, {outcome.distinct} distinct disks recovered")
    assert not outcome.failures, "\n".join(outcome.failures[:10])
    ops = max(outcome.cases.values()) - 1  # one case per op, and one after the command returned
    assert ops >= 1, f"{name} did no fs operation"
    assert outcome.distinct > 1, "every cut left the same disk: the simulator dropped nothing"


@pytest.mark.skipif("SLM_POWERCUT_REPLAY" not in os.environ,
                    reason="replays the one cut named by SLM_POWERCUT_REPLAY=SCENARIO:op=N:mode=M:seed=S")
def test_replay(matrix_template, tmp_path):
    name, op, mode, seed = dm.parse_replay(os.environ["SLM_POWERCUT_REPLAY"])
    scenario = _scenario(matrix_template, name)
    rec = dm.record(scenario, matrix_template, tmp_path / "rec", [])
    dm.replay(scenario, matrix_template, tmp_path / "cut", op, mode, seed)
    with dm.frozen_clock():
        problems = dm.check_recovered(tmp_path / "cut" / "store", rec, op == rec.last_op + 1)
    assert not problems, dm.failure_line(scenario, op, mode, seed, rec, problems)
