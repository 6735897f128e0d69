"""`slm follow REF --once`: one round of a device that follows a registry tag, each outcome
(updated, current, rolled-back, known-bad), the follower's state (follow/state.json) and its
options, against Debian's docker-registry on loopback with the tiny model's stores. (The fleet
of real follower processes is tests/fleet/test_follow_fleet.py; crashes are tests/durability.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomlkit

from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import ed25519_key, refused, snapshot, tiny_store


@pytest.fixture(scope="module")
def publisher(tmp_path_factory, tiny_model):
    """A store with three compositions of the tiny model (v1..v3 of a tag: tq + a1, a2, a3)."""
    root = tmp_path_factory.mktemp("publisher")
    store = tiny_store(root, tiny_model, 3, steps=[("tag", f"c{i}", f"tq+a{i}@0.5") for i in (1, 2, 3)])
    key, public = ed25519_key(root / "publisher.pem", 7)
    return store, key, public


def _publish(cli, publisher, registry, repo: str, adapter: str, version: int, expires: str = "1d") -> str:
    """Push tq+ADAPTER to REPO:prod with a statement of VERSION; its composition id."""
    store, key, _ = publisher
    spec = f"tq+{adapter}@0.5"
    comp = cli("--store", store, "show", spec, "--json").json()["id"]
    signed = cli("--store", store, "sign", spec, "--key", key, "--for", f"{repo}:prod", "--version", str(version),
                 "--expires", expires)
    assert signed.code == 0, signed.err
    pushed = cli("--store", store, "push", f"{registry.host}/{repo}:prod", spec)
    assert pushed.code == 0, pushed.err
    return comp


def _device(cli, tmp_path: Path, public: str | None, name: str = "dev", follow: dict | None = None) -> Path:
    dev = tmp_path / name
    assert cli("--store", dev, "init").code == 0
    doc = tomlkit.parse((dev / "config.toml").read_text())
    if public is not None:
        doc["require_signed"], doc["trusted_keys"] = True, [public]
    if follow:
        doc["follow"] = follow
    (dev / "config.toml").write_text(tomlkit.dumps(doc))
    return dev


def _reject(dev: Path, comp: str) -> None:
    """A health.d script that fails the composition `comp` (and passes any other)."""
    (dev / "health.d").mkdir(exist_ok=True)
    script = dev / "health.d" / "reject"
    script.write_text(f'#!/bin/sh\nif [ "$SLM_COMPOSITION" = "{comp}" ]; then echo "answers garbage" >&2; exit 3; fi\n')
    script.chmod(0o755)


def _round(cli, dev: Path, ref: str):
    r = cli("--store", dev, "follow", ref, "--once", "--json")
    return r, r.json()


def _status(cli, dev: Path) -> dict:
    r = cli("--store", dev, "follow", "--status", "--json")
    assert r.code == 0, r.err
    return r.json()


def test_a_round_updates_the_device_then_finds_it_current(cli, tmp_path, publisher, registry):  # noqa: F811
    repo = "fleet/updates"
    ref = f"{registry.host}/{repo}:prod"
    v1 = _publish(cli, publisher, registry, repo, "a1", 1)
    dev = _device(cli, tmp_path, publisher[2])
    r, out = _round(cli, dev, ref)
    assert r.code == 0, r.err
    assert (out["outcome"], out["composition"], out["version"]) == ("updated", v1, 1)
    assert [c["status"] for c in out["health"]["checks"]][:3] == ["passed", "skipped", "passed"]
    r, out = _round(cli, dev, ref)
    assert (r.code, out["outcome"], out["composition"]) == (0, "current", v1)

    v2 = _publish(cli, publisher, registry, repo, "a2", 2)
    r, out = _round(cli, dev, ref)
    assert (r.code, out["outcome"], out["composition"], out["version"]) == (0, "updated", v2, 2)
    assert cli("--store", dev, "status", "--json").json()["active"]["id"] == v2
    log = cli("--store", dev, "log", "--json").json()
    assert [e["op"] for e in log][-2:] == ["follow", "follow-trial"] or [e["op"] for e in log][:2] == \
        ["follow-trial", "follow"]
    status = _status(cli, dev)
    assert status["reference"] == ref and status["good"]["composition"] == v2 and status["good"]["version"] == 2
    assert status["trial"] is None and status["bad"] == [] and status["following"] is False
    assert status["last_outcome"] == "updated" and status["last_exit_code"] == 0
    assert cli("--store", dev, "fsck").code == 0


def test_a_failing_trial_rolls_back_and_is_never_tried_again(cli, tmp_path, publisher, registry):  # noqa: F811
    repo = "fleet/rollback"
    ref = f"{registry.host}/{repo}:prod"
    v1 = _publish(cli, publisher, registry, repo, "a1", 1)
    dev = _device(cli, tmp_path, publisher[2])
    assert _round(cli, dev, ref)[0].code == 0
    v2 = _publish(cli, publisher, registry, repo, "a2", 2)
    _reject(dev, v2)
    r, out = _round(cli, dev, ref)
    assert r.code == 18, r.err
    assert (out["outcome"], out["composition"], out["version"]) == ("rolled-back", v1, 1)
    assert "script:reject" in out["message"] and "answers garbage" in out["message"]
    assert cli("--store", dev, "status", "--json").json()["active"]["id"] == v1
    bad = _status(cli, dev)["bad"]
    assert [(b["composition"], b["version"]) for b in bad] == [(v2, 2)]

    before = snapshot(dev)
    r, out = _round(cli, dev, ref)
    assert (r.code, out["outcome"], out["composition"]) == (18, "known-bad", v1)
    assert snapshot(dev) == before  # nothing pulled, nothing activated
    # an operator clears the mark: the composition is tried again (and fails again)
    assert cli("--store", dev, "follow", "--clear-bad", "--digest", v2).code == 0
    assert _status(cli, dev)["bad"] == []
    r, out = _round(cli, dev, ref)
    assert (r.code, out["outcome"]) == (18, "rolled-back")
    assert cli("--store", dev, "fsck").code == 0


def test_a_first_trial_on_an_empty_device_is_checked_before_it_is_active(cli, tmp_path, publisher, registry):  # noqa: F811
    """Nothing was active to roll back to: the trial is checked first, and a failing one never runs."""
    repo = "fleet/empty"
    ref = f"{registry.host}/{repo}:prod"
    v1 = _publish(cli, publisher, registry, repo, "a1", 1)
    dev = _device(cli, tmp_path, publisher[2])
    _reject(dev, v1)
    r, out = _round(cli, dev, ref)
    assert (r.code, out["outcome"], out["composition"]) == (18, "rolled-back", None)
    assert cli("--store", dev, "status", "--json").json()["active"] is None
    assert [b["composition"] for b in _status(cli, dev)["bad"]] == [v1]


def test_a_pending_trial_counts_a_death_per_start_and_rolls_back_at_the_limit(cli, tmp_path, publisher,
                                                                              registry):  # noqa: F811
    """A follower that starts and finds a trial died during it: the boot-count rule."""
    from slm.ops.ship import follow_state as fstate
    from slm.store import StoreDir

    repo = "fleet/deaths"
    ref = f"{registry.host}/{repo}:prod"
    v1 = _publish(cli, publisher, registry, repo, "a1", 1)
    dev = _device(cli, tmp_path, publisher[2], follow={"max_trial_deaths": 2})
    assert _round(cli, dev, ref)[0].code == 0
    v2 = _publish(cli, publisher, registry, repo, "a2", 2)
    assert cli("--store", dev, "pull", ref).code == 0
    manifest = cli("--store", dev, "pull", ref, "--json").json()["manifest_digest"]

    def plant_trial(deaths: int) -> None:  # what a follower killed after staging leaves
        store = StoreDir.open(dev)
        state = fstate.read(store)
        trial = fstate.Trial(v2, manifest, 2, previous=v1, deaths=deaths)
        fstate.write(store, state, fstate.FollowState(state.reference, state.good, trial, state.bad), "follow-stage")

    plant_trial(0)  # one death (this start) of two allowed: resumed, and it passes
    r, out = _round(cli, dev, ref)
    assert (r.code, out["outcome"], out["composition"]) == (0, "updated", v2), r.err
    v3 = _publish(cli, publisher, registry, repo, "a3", 3)
    assert cli("--store", dev, "pull", ref).code == 0
    manifest = cli("--store", dev, "pull", ref, "--json").json()["manifest_digest"]
    v1, v2 = v2, v3
    plant_trial(1)  # the second death: rolled back without running its checks
    r, out = _round(cli, dev, ref)
    assert (r.code, out["outcome"], out["composition"]) == (18, "rolled-back", v1)
    assert "died 2 times" in out["message"]
    assert [b["composition"] for b in _status(cli, dev)["bad"]] == [v2]


def test_fsck_rolls_back_a_trial_no_follower_runs(cli, tmp_path, publisher, registry):  # noqa: F811
    from slm.ops.ship import follow_state as fstate
    from slm.store import StoreDir

    repo = "fleet/fsck"
    ref = f"{registry.host}/{repo}:prod"
    v1 = _publish(cli, publisher, registry, repo, "a1", 1)
    dev = _device(cli, tmp_path, publisher[2])
    assert _round(cli, dev, ref)[0].code == 0
    v2 = _publish(cli, publisher, registry, repo, "a2", 2)
    manifest = cli("--store", dev, "pull", ref, "--json").json()["manifest_digest"]
    store = StoreDir.open(dev)
    state = fstate.read(store)
    fstate.write(store, state, fstate.FollowState(state.reference, state.good,
                                                  fstate.Trial(v2, manifest, 2, previous=v1), state.bad), "follow-stage")
    assert cli("--store", dev, "activate", v2[7:19]).code == 0  # the trial made active, then the follower died
    found = cli("--store", dev, "fsck", "--json")
    assert found.code != 0 and "follow-trial" in [f["problem"] for f in found.json()["findings"]]
    assert cli("--store", dev, "fsck", "--repair").code == 0
    assert cli("--store", dev, "status", "--json").json()["active"]["id"] == v1
    status = _status(cli, dev)
    assert status["trial"] is None and [b["composition"] for b in status["bad"]] == [v2]
    assert cli("--store", dev, "fsck").code == 0


def test_following_needs_a_trusted_key(cli, tmp_path, publisher, registry):  # noqa: F811
    repo = "fleet/untrusted"
    _publish(cli, publisher, registry, repo, "a1", 1)
    dev = _device(cli, tmp_path, None)
    r = refused(cli, dev, 6, "follow", f"{registry.host}/{repo}:prod", "--once")
    assert "trusted_keys" in r.err


def test_a_store_follows_one_tag_until_it_forgets_it(cli, tmp_path, publisher, registry):  # noqa: F811
    _publish(cli, publisher, registry, "fleet/one", "a1", 1)
    _publish(cli, publisher, registry, "fleet/other", "a1", 1)
    dev = _device(cli, tmp_path, publisher[2])
    assert _round(cli, dev, f"{registry.host}/fleet/one:prod")[0].code == 0
    r = refused(cli, dev, 4, "follow", f"{registry.host}/fleet/other:prod", "--once")
    assert "follows" in r.err and "--forget" in r.err
    assert cli("--store", dev, "follow", "--forget").code == 0
    assert _status(cli, dev)["reference"] is None
    assert _round(cli, dev, f"{registry.host}/fleet/other:prod")[0].code == 0


@pytest.mark.parametrize("args, code", [
    (("follow", "localhost:5000/a/b@sha256:" + "0" * 64, "--once"), 4),  # a digest names no version
    (("follow", "localhost:5000/a/b:prod", "--once", "--interval", "0s"), 4),
    (("follow", "localhost:5000/a/b:prod", "--once", "--interval", "1_0"), 4),
    (("follow", "localhost:5000/a/b:prod", "--once", "--interval", "9999d"), 4),
    (("follow", "--status", "--forget"), 2),
    (("follow", "--digest", "sha256:" + "0" * 64), 2),
    (("follow", "--once"), 2),
])
def test_bad_follow_arguments_are_refused_with_the_store_unchanged(cli, tmp_path, args, code):
    dev = _device(cli, tmp_path, None)
    refused(cli, dev, code, *args)


def test_a_damaged_state_file_is_reported_by_fsck_and_refused_by_the_follower(cli, tmp_path):
    dev = _device(cli, tmp_path, None)
    (dev / "follow").mkdir()
    (dev / "follow" / "state.json").write_text(json.dumps({"schema": "slm.follow/1", "reference": None,
                                                           "good": None, "trial": None, "bad": "x"}))
    assert cli("--store", dev, "follow", "--status").code == 5
    found = cli("--store", dev, "fsck", "--json")
    assert found.code != 0 and "follow-state" in [f["problem"] for f in found.json()["findings"]]


def test_require_certificate_fails_a_trial_without_one_and_passes_a_certified_one(cli, tmp_path, publisher,
                                                                                  registry):  # noqa: F811
    """[follow] require_certificate: a registry that withholds the certificate cannot skip its check."""
    store, key, public = publisher
    repo = "fleet/certified"
    ref = f"{registry.host}/{repo}:prod"
    v1 = _publish(cli, publisher, registry, repo, "a1", 1)
    dev = _device(cli, tmp_path, public, follow={"require_certificate": True})
    r, out = _round(cli, dev, ref)
    assert (r.code, out["outcome"], out["composition"]) == (18, "rolled-back", None)
    assert "require_certificate" in out["message"]
    certified = cli("--store", store, "verify", "tq+a1@0.5", "--certificate", tmp_path / "cert.json", "--key", key,
                    "--json")
    assert certified.code == 0 and certified.json()["recorded"], certified.err
    assert cli("--store", store, "push", ref, "tq+a1@0.5").code == 0
    assert cli("--store", dev, "follow", "--clear-bad").code == 0
    r, out = _round(cli, dev, ref)
    assert (r.code, out["outcome"], out["composition"]) == (0, "updated", v1), out
    assert [c["status"] for c in out["health"]["checks"] if c["name"] == "certificate"] == ["passed"]


def test_sigterm_ends_the_loop_once_the_round_in_progress_is_over(cli, tmp_path, publisher, registry):  # noqa: F811
    """systemctl stop during a trial: the trial finishes its checks and is marked good, it is not
    cut short to be counted as a death at the next start."""
    import os
    import signal
    import subprocess
    import sys
    import time

    repo = "fleet/sigterm"
    ref = f"{registry.host}/{repo}:prod"
    v1 = _publish(cli, publisher, registry, repo, "a1", 1)
    dev = _device(cli, tmp_path, publisher[2])
    started = tmp_path / "script-started"
    (dev / "health.d").mkdir()
    script = dev / "health.d" / "slow"
    script.write_text(f"#!/bin/sh\ntouch {started}\nsleep 2\nexit 0\n")
    script.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "slm", "--store", str(dev), "follow", ref, "--interval", "1h",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.stderr.read() if proc.poll() is not None else "the script never started"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    rounds = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert [(r["outcome"], r["composition"]) for r in rounds] == [("updated", v1)]
    status = _status(cli, dev)
    assert status["good"]["composition"] == v1 and status["trial"] is None
