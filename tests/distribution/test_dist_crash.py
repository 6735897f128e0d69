"""kill -9 during `slm pull` (10 seeded instants) and crashes at every named point of the
receive transaction: after `slm fsck --repair` the store is the old one or the new one, and
`slm fsck` is clean."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import TINY_LORA


def _slm(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "slm", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, **kw)


@pytest.fixture(scope="module")
def world(tmp_path_factory, registry, tiny_model):  # noqa: F811
    """A pushed composition, and an "old" store holding only its base."""
    import make_random_lora

    root = tmp_path_factory.mktemp("crash")
    lora = make_random_lora.make_random_lora(root / "lora", seed=4, **TINY_LORA)
    a, old = root / "a", root / "old"
    for args in (("init",), ("import", "base", tiny_model["gguf"], "--name", "tiny"),
                 ("import", "adapter", lora, "--name", "demo"), ("activate", "tiny", "demo@0.9")):
        assert _slm("--store", a, *args).returncode == 0
    ref = f"{registry.host}/crash/tiny:v1"
    assert _slm("--store", a, "push", ref).returncode == 0
    assert _slm("--store", old, "init").returncode == 0
    assert _slm("--store", old, "import", "base", tiny_model["gguf"], "--name", "tiny").returncode == 0
    new = root / "new"
    shutil.copytree(old, new)
    proc = _start_pull(new, ref)
    receiving = _wait_for_staging(new, proc)
    assert proc.wait() == 0
    return {"ref": ref, "old": old, "new": new, "seconds": time.monotonic() - receiving}


def _start_pull(store: Path, ref: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "slm", "--store", str(store), "pull", ref],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_staging(store: Path, proc: subprocess.Popen) -> float:
    """When the pull starts receiving (its staging directory appears under tmp/): the instants
    are drawn from there on, so interpreter start-up on a loaded machine does not eat them."""
    while proc.poll() is None and not any((store / "tmp").iterdir()):
        time.sleep(0.002)
    return time.monotonic()


def _names(store: Path) -> dict[str, str]:
    """The names the receive transaction sets. The pulled reference (names/remotes/) is named by
    a transaction of its own after it (docs/exit-codes.md), so it is not part of old-or-new."""
    return {str(p.relative_to(store / "names")): p.read_text() for p in sorted((store / "names").rglob("*"))
            if p.is_file() and not p.relative_to(store / "names").parts[0] == "remotes"}


def _check_old_or_new(world, store: Path) -> str:
    """Repair, check clean, and say which state the store is in ("+" if it needed repair)."""
    dirty = _slm("--store", store, "fsck").returncode != 0
    repair = _slm("--store", store, "fsck", "--repair")
    assert repair.returncode == 0, repair.stdout + repair.stderr
    check = _slm("--store", store, "fsck", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    names = _names(store)
    if names == _names(world["old"]):
        return "old+" if dirty else "old"
    assert names == _names(world["new"]), "neither the old store nor the new one"
    got = _slm("--store", store, "activate", next(k for k in names if k.startswith("compositions/")).split("/")[1])
    assert got.returncode == 0, got.stderr
    return "new+" if dirty else "new"


def test_kill_9_during_pull_leaves_old_or_new(tmp_path, world):
    rng = random.Random(20261201)
    outcomes = []
    for i in range(10):
        store = tmp_path / f"s{i}"
        shutil.copytree(world["old"], store)
        delay = rng.uniform(0.0, world["seconds"])
        proc = _start_pull(store, world["ref"])
        _wait_for_staging(store, proc)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        outcomes.append((round(delay, 3), _check_old_or_new(world, store)))
    print("kill -9 at (s, outcome):", outcomes)


@pytest.mark.parametrize("point", ["bundle.staged", "journal.before-intent", "bundle.before-commit",
                                   "bundle.before-record", "journal.before-clear"])
def test_a_crash_at_each_point_of_the_transaction_leaves_old_or_new(tmp_path, world, point):
    store = tmp_path / "s"
    shutil.copytree(world["old"], store)
    r = _slm("--store", store, "pull", world["ref"], env={"SLM_FAULTS": f"crash@point={point}"})
    assert r.returncode == 86, r.stderr
    outcome = _check_old_or_new(world, store)
    assert outcome.rstrip("+") == ("new" if point in ("bundle.before-record", "journal.before-clear") else "old")
    if point in ("bundle.staged", "journal.before-intent"):
        # before the transaction: nothing to repair, and what the pull verified is kept for the next
        # (the pull's staging under tmp/, which fsck leaves alone)
        assert [p.name.startswith("pull-") for p in (store / "tmp").iterdir()] == [True]
    else:
        assert outcome.endswith("+")  # a crash inside the transaction needed repair
