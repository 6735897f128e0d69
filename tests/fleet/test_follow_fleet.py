"""Five devices follow one tag, each a real `python -m slm --store DEV follow REF --interval 2s
--json` process (its rounds read from stdout, a JSON object a line), against Debian's
docker-registry on loopback (tests/distribution/dist_fixtures.py). The compositions are the
synthetic tiny model's (helpers.tiny_store: a tiny base, random LoRA adapters) so that a round's
pull, load and health checks take a moment: what is shown is the follower's protocol, not a
real model's numbers. Each published version carries an honest certificate (`slm verify
--certificate`: its golden answers), recorded with it and pushed with it.

    v1      published before the followers start: each device's first round takes it
    v2      all five run it (active, marked good) within two intervals (a deadline of two
            jittered intervals plus a margin for a loaded machine: a hang guard, not a timing)
    v3      fails its health check, either way, and on every device: rolled back to v2, marked bad;
            then never pulled again while the tag names it (the registry's access log after
            the mark holds no request for v3's manifest by digest or for its own blobs)
              script   a health.d script of the devices rejects it (the operator's check)
              golden   its certificate is v2's answers re-signed by the trusted key for v3:
                       what an adapter that changes the golden prompt's answer looks like
    v4      all five move to it

Every wait is for a state, bounded; every follower is killed in a `finally`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dist_fixtures import local_registry
from fleet_follow_fixtures import (REPOSITORY, TAG, activate, active_id, device, private_key, push,
                                   sign)
from helpers import copy_store, ed25519_key, tiny_store

ROOT = Path(__file__).resolve().parents[2]
DEVICES = 5
INTERVAL_S = 2.0
JITTER = 0.1  # slm.ops.ship.follow_loop.JITTER
# A round's pull, load and checks, and five followers' rounds at once, on two cores other tests
# share: the margin only turns a hang into a failure.
MARGIN_S = 90.0
WITHIN_TWO_INTERVALS_S = 2 * INTERVAL_S * (1 + JITTER) + MARGIN_S
STARTUP_S = 180.0  # five Python processes importing slm, then their first round
KNOWN_BAD_ROUNDS = 2  # rounds each device reports the tag as known-bad before v3 is replaced


@pytest.fixture(scope="module")
def publisher_template(tmp_path_factory, tiny_model) -> Path:
    """The tiny base and adapters a1..a4: version N is the base with aN at 0.5."""
    return tiny_store(tmp_path_factory.mktemp("publisher"), tiny_model, 4)


class Follower:
    """One device's `slm follow` process; its rounds (the JSON lines) gathered by a thread."""

    def __init__(self, store: Path, ref: str, log: Path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.store = store
        self.stderr = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slm", "--store", str(store), "follow", ref, "--interval", f"{INTERVAL_S:g}s",
             "--json"], stdout=subprocess.PIPE, stderr=self.stderr, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
        self.rounds: list[dict] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:  # not one JSON object a line: an outcome "error", which fails the test
                doc = {"unparsed": line.decode(errors="replace")}
            with self._lock:
                self.rounds.append(doc)

    def outcomes(self) -> list[str]:
        with self._lock:
            return [r.get("outcome", "error") for r in self.rounds]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(30)
        self.stderr.close()


def _status(cli, store: Path) -> dict | None:
    r = cli("--store", store, "follow", "--status", "--json")
    return r.json() if r.code == 0 else None


def _wait_all(cli, followers: list[Follower], condition, what: str, timeout: float) -> list[dict]:
    """Poll every device's `slm follow --status --json` until `condition` holds for all of them;
    a follower that exits, or the deadline, fails the test with what each one said."""
    deadline = time.monotonic() + timeout
    while True:
        statuses = [_status(cli, f.store) for f in followers]
        if all(s is not None and condition(s) for s in statuses):
            return statuses
        for f in followers:
            if f.proc.poll() is not None:
                pytest.fail(f"a follower exited ({f.proc.returncode}) before {what}: {f.outcomes()}")
        if time.monotonic() > deadline:
            said = [(f.outcomes()[-3:], s and (s["active"], s["good"], s["last_error"])) for f, s in
                    zip(followers, statuses)]
            pytest.fail(f"not every device {what} after {timeout:g} s: {said}")
        time.sleep(0.2)


def _runs(comp_id: str, version: int):
    def condition(s: dict) -> bool:
        return s["active"] == comp_id and s["trial"] is None and s["good"] is not None \
            and (s["good"]["version"], s["good"]["composition"]) == (version, comp_id)
    return condition


class Publisher:
    def __init__(self, cli, tmp_path: Path, template: Path, host: str):
        self.cli = cli
        self.store = copy_store(template, tmp_path / "publisher")
        self.key, self.public = ed25519_key(tmp_path / "ci.pem", 1)
        self.ref = f"{host}/{REPOSITORY}:{TAG}"
        self.certificates = tmp_path / "certificates"
        self.certificates.mkdir()

    def compose(self, version: int, *, certify: bool = True) -> str:
        comp_id = activate(self.cli, self.store, f"a{version}@0.5")
        if certify:
            r = self.cli("--store", self.store, "verify", comp_id, "--certificate", self.certificates / f"v{version}",
                         "--key", self.key)
            assert r.code == 0, r.err
        return comp_id

    def release(self, comp_id: str, version: int) -> None:
        sign(self.cli, self.store, comp_id, self.key, version)
        push(self.cli, self.store, self.ref, comp_id)

    def forge_certificate(self, comp_id: str, answers_of: int) -> None:
        """A certificate of `comp_id` that records version `answers_of`'s results (its golden
        answers), signed by the trusted key and recorded with `comp_id`, so it is pushed with it."""
        from slm.distribution import signing
        from slm.ops.ship import certificates
        from slm.store import StoreDir

        _, _, result = signing.check_certificate((self.certificates / f"v{answers_of}").read_bytes())
        blob = signing.certificate(comp_id, result, private_key(self.key))
        store = StoreDir.open(self.store)
        with store.locked():
            certificates.record(store, comp_id, blob)


def _manifest(ref: str) -> tuple[str, dict]:
    """The digest and the document of the manifest the tag names now."""
    from slm.distribution.bundle import sha256_of
    from slm.distribution.reference import parse_reference
    from slm.distribution.registry import Registry

    client = Registry(parse_reference(ref), False)
    try:
        data = client.get_manifest(TAG)
    finally:
        client.close()
    assert data is not None
    return sha256_of(data), json.loads(data)


def _own_digests(manifest: dict, other: dict) -> set[str]:
    """The config and layers of `manifest` that `other` does not share."""
    def digests(m: dict) -> set[str]:
        return {m["config"]["digest"], *(layer["digest"] for layer in m["layers"])}
    return digests(manifest) - digests(other)


def _requests_for(log: str, digests: set[str]) -> list[str]:
    """The access-log lines of requests that name one of `digests` in their path."""
    wanted = "|".join(re.escape(d) for d in digests)
    return [line for line in log.splitlines() if re.search(rf'"(GET|HEAD) /v2/\S*({wanted})', line)]


@pytest.mark.parametrize("failing", ["script", "golden"])
def test_five_devices_follow_a_tag_and_roll_back_a_version_that_fails_its_checks(
        cli, tmp_path, publisher_template, failing):
    (tmp_path / "registry").mkdir()
    with local_registry(tmp_path / "registry") as registry:
        pub = Publisher(cli, tmp_path, publisher_template, registry.host)
        rejected = tmp_path / "rejected"  # the composition ids the operator's health.d script refuses
        devices = []
        for n in range(DEVICES):
            store = device(tmp_path / f"device{n}", pub.public)
            script = store / "health.d" / "10-operator"
            script.parent.mkdir()
            script.write_text(f'#!/bin/sh\nif [ -f "{rejected}" ] && grep -qxF "$SLM_COMPOSITION" "{rejected}"; then\n'
                              '  echo "rejected by the operator: $SLM_COMPOSITION" >&2\n  exit 1\nfi\n')
            script.chmod(0o755)
            devices.append(store)

        v1 = pub.compose(1)
        pub.release(v1, 1)
        followers = []
        try:
            for n, store in enumerate(devices):
                followers.append(Follower(store, pub.ref, tmp_path / f"follower{n}.err"))
            _wait_all(cli, followers, _runs(v1, 1), "runs v1", STARTUP_S)

            v2 = pub.compose(2)
            pub.release(v2, 2)
            _, v2_manifest = _manifest(pub.ref)
            _wait_all(cli, followers, _runs(v2, 2), "runs v2", WITHIN_TWO_INTERVALS_S)

            if failing == "script":
                v3 = pub.compose(3)
                rejected.write_text(v3 + "\n")
                why = ("the script:10-operator check failed: exit 1: rejected by the operator",)
            else:
                v3 = pub.compose(3, certify=False)
                pub.forge_certificate(v3, answers_of=2)
                why = ("the certificate check failed", "differs from the certified one")
            pub.release(v3, 3)
            v3_digest, v3_manifest = _manifest(pub.ref)

            def rolled_back(s: dict) -> bool:
                return _runs(v2, 2)(s) and [(b["composition"], b["manifest"]) for b in s["bad"]] == [(v3, v3_digest)]
            statuses = _wait_all(cli, followers, rolled_back, "rolls v3 back and marks it bad", WITHIN_TWO_INTERVALS_S)
            for s in statuses:
                assert all(words in s["bad"][0]["reason"] for words in why), s["bad"]
            log = registry.storage.parent / "registry.log"
            marked = log.stat().st_size
            # its manifest, its referrers' index (its statements), its config and its own blobs
            v3_own = {v3_digest, v3_digest.replace(":", "-")} | _own_digests(v3_manifest, v2_manifest)
            pulled_before = _requests_for(log.read_text(errors="replace"), {v3_digest})
            assert len(pulled_before) >= DEVICES, pulled_before  # each device pulled v3 by digest once

            def seen_known_bad(f: Follower) -> bool:
                outcomes = f.outcomes()
                return "rolled-back" in outcomes and \
                    outcomes[outcomes.index("rolled-back") + 1:].count("known-bad") >= KNOWN_BAD_ROUNDS
            deadline = time.monotonic() + (KNOWN_BAD_ROUNDS + 1) * INTERVAL_S * (1 + JITTER) + MARGIN_S
            while not all(seen_known_bad(f) for f in followers):
                assert time.monotonic() < deadline, [f.outcomes() for f in followers]
                assert all(f.proc.poll() is None for f in followers)
                time.sleep(0.2)
            with open(log, "rb") as f:
                f.seek(marked)
                after = f.read().decode(errors="replace")
            assert f'"GET /v2/{REPOSITORY}/manifests/{TAG} ' in after  # the devices kept asking ...
            assert _requests_for(after, v3_own) == []  # ... and fetched nothing of v3 again

            v4 = pub.compose(4)
            pub.release(v4, 4)
            statuses = _wait_all(cli, followers, _runs(v4, 4), "runs v4", WITHIN_TWO_INTERVALS_S)
            assert all([b["composition"] for b in s["bad"]] == [v3] for s in statuses)
            assert [active_id(cli, store) for store in devices] == [v4] * DEVICES  # `slm status` says so too
            for f in followers:
                outcomes = f.outcomes()
                assert outcomes.count("rolled-back") == 1, outcomes
                # Every line a round's result, or a registry error (12): distribution 2.8 rewrites
                # a tag's link file in place, so a read that races a push's tag update may get
                # HTTP 500 ("invalid checksum digest format"), and the round is retried. No
                # refusal of anything the publisher signed.
                errors = [r for r in f.rounds if "outcome" not in r]
                assert all(r.get("exit_code") == 12 for r in errors), errors
        finally:
            for f in followers:
                f.stop()
