"""`slm serve --follow REF`: a real server (uvicorn, loopback) follows a tag on a real registry
(Debian's docker-registry): a new signed version is served once its health checks pass; one a
health.d script rejects is rolled back while the server keeps answering on the good one, and
/metrics tells the rounds, the state and the bad mark; SIGTERM stops the loop and the server,
and a round still running past the grace period is abandoned and resumed at the next start;
a second follower of the store is refused while the server follows."""

from __future__ import annotations

import json
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import refused
from serve_helpers import Server
from test_follow import _device, _publish, _reject, publisher  # noqa: F401  (fixture)

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0}
WAIT_S = 180  # a hang guard for what the follower does in the background (a loaded machine is slow)


def _metrics(server: Server) -> dict[str, list]:
    """/metrics parsed by prometheus_client's own parser: {family name: [samples]}."""
    status, _, body = server.http("GET", "/metrics")
    assert status == 200
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def _rounds(metrics: dict, outcome: str) -> float:
    return sum(s.value for s in metrics.get("slm_follow_rounds", []) if s.name == "slm_follow_rounds_total"
               and s.labels["outcome"] == outcome)


def _served(server: Server) -> str:
    """The composition the server answers on now (/health's slm-composition header)."""
    status, headers, _ = server.http("GET", "/health")
    assert status == 200  # the device keeps serving throughout, a roll-back included
    return headers["slm-composition"]


def _until(what, server: Server, describe: str):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        assert server.proc.poll() is None, "the server exited:\n" + "\n".join(server.lines)
        time.sleep(0.1)
    raise AssertionError(f"{describe} did not happen within {WAIT_S} s:\n" + "\n".join(server.lines))


class _Streams:
    """A client streaming completions one after another until stopped (bounded): each answer's
    set of system_fingerprints, its chunks' compositions."""

    def __init__(self, server: Server):
        self.client, self.done, self.failures = server.client(), threading.Event(), []
        self.fingerprints: list[set[str]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for _ in range(100_000):
            if self.done.is_set():
                return
            try:
                chunks = list(self.client.completions.create(model="active", prompt="Once upon a time", max_tokens=16,
                                                             temperature=0, stream=True))
            except Exception as err:  # noqa: BLE001 (any failure is the test's finding)
                self.failures.append(repr(err))
                return
            self.fingerprints.append({c.system_fingerprint for c in chunks})

    def stop(self) -> list[set[str]]:
        self.done.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive() and self.failures == [], self.failures
        return self.fingerprints


def _answer(server: Server) -> tuple[str, str]:
    """(the slm-composition header, the system_fingerprint) of one chat completion."""
    status, headers, body = server.http("POST", "/v1/chat/completions", CHAT)
    assert status == 200, body
    return headers["slm-composition"], json.loads(body)["system_fingerprint"]


def test_the_server_serves_each_good_version_and_keeps_serving_through_a_roll_back(cli, tmp_path, registry,  # noqa: F811
                                                                                     publisher):  # noqa: F811
    repo = "fleet/served"
    ref = f"{registry.host}/{repo}:prod"
    v1 = _publish(cli, publisher, registry, repo, "a1", 1)
    device = _device(cli, tmp_path, publisher[2])
    v3 = cli("--store", publisher[0], "show", "tq+a3@0.5", "--json").json()["id"]
    _reject(device, v3)  # the device's health.d script fails v3

    server = Server(device, "--follow", ref, "--follow-interval", "1s")
    try:
        assert any(f"following {ref}" in line for line in server.lines), server.lines
        _until(lambda: _served(server) == v1, server, "serving v1")
        assert _answer(server) == (v1, v1)
        streams = _Streams(server)  # clients stream throughout the update and the roll-back

        v2 = _publish(cli, publisher, registry, repo, "a2", 2)
        _until(lambda: _served(server) == v2, server, "serving v2")
        assert _answer(server) == (v2, v2)
        _until(lambda: _rounds(_metrics(server), "updated") >= 2, server, "two updates counted")

        assert _publish(cli, publisher, registry, repo, "a3", 3) == v3
        _until(lambda: _rounds(_metrics(server), "rolled-back") == 1, server, "v3 rolled back")
        assert _served(server) == v2 and _answer(server) == (v2, v2)
        # every answer ran on one composition from its first chunk to its last, across the swaps
        fingerprints = streams.stop()
        assert fingerprints and all(len(f) == 1 for f in fingerprints), fingerprints
        assert {v1, v2} <= set().union(*fingerprints) <= {v1, v2, v3}
        metrics = _metrics(server)
        info = metrics["slm_follow_info"][0]
        assert (info.labels["reference"], info.labels["composition"], info.labels["good_composition"],
                info.labels["good_version"]) == (ref, v2, v2, "2")
        assert [(s.labels["composition"], s.labels["version"]) for s in metrics["slm_follow_bad_info"]] == [(v3, "3")]
        assert metrics["slm_follow_running"][0].value == 1
        assert metrics["slm_follow_trial"][0].value == 0
        assert metrics["slm_follow_consecutive_failures"][0].value == 0
        checked = metrics["slm_follow_last_check_timestamp_seconds"][0].value
        assert metrics["slm_follow_next_try_timestamp_seconds"][0].value >= checked
        rolled = next(s for s in metrics["slm_follow_rounds"] if s.labels["outcome"] == "rolled-back")
        assert rolled.labels["exit_code"] == "18"
        # the tag still names v3: it is known bad, never pulled again, and v2 goes on serving
        _until(lambda: _rounds(_metrics(server), "known-bad") >= 1, server, "a known-bad round")
        assert _served(server) == v2
        assert any("rolled-back" in line and "answers garbage" in line for line in server.lines), server.lines

        # the server's follower holds the store's follow lock: a second follower is refused
        second = cli("--store", device, "follow", ref, "--once")
        assert second.code == 7 and "another follower" in second.err
    finally:
        assert server.stop() == 0
    assert any(line.endswith("stopped") for line in server.lines)
    status = cli("--store", device, "follow", "--status", "--json").json()
    assert (status["good"]["composition"], [b["composition"] for b in status["bad"]]) == (v2, [v3])
    assert status["following"] is False and status["trial"] is None


def test_sigterm_stops_the_follow_loop_and_the_server(cli, tmp_path, registry, publisher):  # noqa: F811
    repo = "fleet/stopped"
    ref = f"{registry.host}/{repo}:prod"
    v1 = _publish(cli, publisher, registry, repo, "a1", 1)
    device = _device(cli, tmp_path, publisher[2])
    # an hour between rounds: the server ends within the test's bound only if the stop event
    # ends the loop's wait
    server = Server(device, "--follow", ref, "--follow-interval", "1h")
    try:
        _until(lambda: _rounds(_metrics(server), "updated") == 1, server, "the first round")
        assert _served(server) == v1
    finally:
        assert server.stop(timeout=60) == 0
    assert cli("--store", device, "follow", "--status", "--json").json()["following"] is False
    assert cli("--store", device, "fsck").code == 0


@pytest.mark.parametrize("args, code, words", [
    (("--follow", "REF", "--model", "REF"), 2, "--model"),
    (("--follow-interval", "5s"), 2, "--follow"),
    (("--follow", "HOST/fleet/smol@sha256:" + "0" * 64), 4, "follow a tag"),
    (("--follow", "REF", "--follow-interval", "0s"), 4, "from 1 second to a week"),
])
def test_follow_refusals_at_start_are_one_line_errors_before_anything_is_served(cli, tmp_path, registry,  # noqa: F811
                                                                               publisher, args, code, words):  # noqa: F811
    device = _device(cli, tmp_path, publisher[2])
    args = [a.replace("REF", f"{registry.host}/fleet/refused:prod").replace("HOST", registry.host) for a in args]
    refused(cli, device, code, "serve", "--port", "0", *args)  # in-process: it must not start serving
    assert words in cli("--store", device, "serve", "--port", "0", *args).err


def test_each_refusal_is_counted_under_its_name_and_exit_code():
    import slm
    from slm.server.metrics import Metrics

    metrics = Metrics()
    refusals = [slm.RollbackRefused, slm.EquivocationRefused, slm.StatementExpired, slm.WrongTarget, slm.Incompatible,
                slm.IntegrityError, slm.IOFailure, slm.NeedsRecovery, slm.Busy]
    for error in refusals:
        metrics.record_follow_round(None, error("refused"))
    metrics.record_follow_round(None, slm.StatementExpired("again"))
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    counted = {(s.labels["outcome"], s.labels["exit_code"]): s.value for s in families["slm_follow_rounds"].samples
               if s.name == "slm_follow_rounds_total"}
    assert counted == {("rollback", "14"): 1, ("equivocation", "15"): 1, ("expired", "16"): 2,
                       ("wrong-target", "17"): 1, ("untrusted", "6"): 1, ("integrity", "5"): 1, ("registry", "12"): 1,
                       ("needs-recovery", "9"): 1, ("busy", "7"): 1}
    assert "slm_follow_info" not in families  # a server that does not follow shows no follower's state


def test_a_round_still_running_after_the_grace_period_is_abandoned_and_resumed_at_the_next_start(
        cli, tmp_path, registry, publisher):  # noqa: F811
    import contextlib
    import os
    import signal

    repo = "fleet/abandoned"
    ref = f"{registry.host}/{repo}:prod"
    v1 = _publish(cli, publisher, registry, repo, "a1", 1)
    device = _device(cli, tmp_path, publisher[2])
    v2 = cli("--store", publisher[0], "show", "tq+a2@0.5", "--json").json()["id"]
    started = tmp_path / "check-started"
    (device / "health.d").mkdir()
    hang = device / "health.d" / "hang"  # v2's check tells it started, then outlasts the grace period
    hang.write_text(f'#!/bin/sh\nif [ "$SLM_COMPOSITION" = "{v2}" ]; then echo $$ > {started}; exec sleep 600; fi\n')
    hang.chmod(0o755)
    server = Server(device, "--follow", ref, "--follow-interval", "1s", "--grace", "1")
    try:
        _until(lambda: _served(server) == v1, server, "serving v1")
        _publish(cli, publisher, registry, repo, "a2", 2)
        _until(lambda: started.exists() and started.read_text().strip(), server, "v2's check")
    finally:
        assert server.stop() == 0
        if started.exists() and started.read_text().strip():
            with contextlib.suppress(ProcessLookupError):  # the script outlives slm, as after a kill
                os.killpg(int(started.read_text()), signal.SIGKILL)
    assert any("the round in progress is abandoned" in line for line in server.lines), server.lines
    status = cli("--store", device, "follow", "--status", "--json").json()
    assert (status["trial"]["composition"], status["trial"]["deaths"], status["active"]) == (v2, 0, v2)

    hang.unlink()  # the next start resumes the trial, counting the abandoned one as a death
    resumed = cli("--store", device, "follow", ref, "--once", "--json")
    assert resumed.code == 0, resumed.err
    assert (resumed.json()["outcome"], resumed.json()["composition"]) == ("updated", v2)
