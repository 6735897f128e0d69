"""Hostile registries, operators and peers against `slm follow` (docs/fleet.md): a publisher store
signs statements for a tag and pushes them to Debian's docker-registry on loopback; a device
store that trusts the publisher's key follows the tag, and what it is served, asked or raced
with misbehaves. Each attack ends refused with the store unchanged, or on a good composition."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import tomlkit

from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import ed25519_key, one_line, snapshot, tiny_store

pytestmark = pytest.mark.hostile

REPO = "fleet/support"



class Publisher:
    """A store of the tiny base with adapters a1..a4: version N of the tag is tq + aN, signed."""

    def __init__(self, cli, root: Path, tiny_model, host: str):
        self.cli, self.host = cli, host
        self.store = tiny_store(root, tiny_model, 4, steps=())
        self.key, self.public = ed25519_key(root / "ci.pem", 7)
        self.ids: dict[int, str] = {}

    def publish(self, version: int, tag: str = "prod", adapter: int | None = None, signed_tag: str | None = None,
                expires: str = "30d") -> str:
        """Version `version` (tq + a<adapter>, default a<version>) pushed as REPO:tag, signed for
        REPO:signed_tag (default tag); returns the composition id."""
        a = self.store
        assert self.cli("--store", a, "activate", "tq", f"a{adapter or version}@0.5").code == 0
        comp = self.cli("--store", a, "status", "--json").json()["active"]["id"]
        signed = self.cli("--store", a, "sign", "--key", self.key, "--for", f"{REPO}:{signed_tag or tag}",
                          "--version", str(version), "--expires", expires)
        assert signed.code == 0, signed.err
        pushed = self.cli("--store", a, "push", f"{self.host}/{REPO}:{tag}")
        assert pushed.code == 0, pushed.err
        self.ids[version] = comp
        return comp


@pytest.fixture(scope="module")
def publisher(registry, tmp_path_factory, tiny_model):  # noqa: F811
    from slm.cli import run

    class _Cli:  # the module-scoped publisher runs the CLI in-process without capsys
        def __call__(self, *args):
            import contextlib
            import io

            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = run([str(x) for x in args])
            return _Result(code, out.getvalue(), err.getvalue())

    return Publisher(_Cli(), tmp_path_factory.mktemp("publisher"), tiny_model, registry.host)


class _Result:
    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err

    def json(self):
        return json.loads(self.out)


def device(cli, root: Path, public: str | None) -> Path:
    """An empty store that trusts `public` (None: no trusted_keys)."""
    store = root / "device"
    assert cli("--store", store, "init").code == 0
    if public is not None:
        doc = tomlkit.parse((store / "config.toml").read_text())
        doc["require_signed"], doc["trusted_keys"] = True, [public]
        (store / "config.toml").write_text(tomlkit.dumps(doc))
    return store


def follow(cli, store: Path, host: str, *args, tag: str = "prod"):
    return cli("--store", store, "follow", f"{host}/{REPO}:{tag}", "--once", "--json", "--insecure", *args)


def state(store: Path) -> dict:
    return json.loads((store / "follow" / "state.json").read_text())


def test_a_device_follows_a_published_version(cli, tmp_path, publisher, registry):  # noqa: F811
    comp = publisher.publish(1)
    dev = device(cli, tmp_path, publisher.public)
    r = follow(cli, dev, registry.host)
    assert r.code == 0, r.err
    assert r.json()["outcome"] == "updated" and state(dev)["good"]["composition"] == comp


def _files(store: Path) -> dict:
    return {k: v for k, v in snapshot(store).items() if k != "cache/follow-status.json"}


def _reject(store: Path, comp: str) -> None:
    """A health.d script that fails the trial of `comp`."""
    script = store / "health.d" / "10-reject"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f'#!/bin/sh\n[ "$SLM_COMPOSITION" != "{comp}" ] || {{ echo "rejects {comp[:19]}" >&2; exit 3; }}\n')
    script.chmod(0o755)


@pytest.mark.parametrize("timeout", ["0", "nan", "-5", "1e308"])
def test_a_bad_timeout_changes_nothing_when_a_new_version_waits(cli, tmp_path, publisher, registry,  # noqa: F811
                                                                 timeout):
    """The trial's deadline is checked before the round: not after the pull and the activation,
    which left the store changed and the trial pending."""
    publisher.publish(1)
    dev = device(cli, tmp_path, publisher.public)
    before = snapshot(dev)
    r = follow(cli, dev, registry.host, "--timeout", timeout)
    assert r.code == 4 and "--timeout" in r.err and one_line(r.err), (r.code, r.err)
    assert snapshot(dev) == before


def test_a_trial_cut_short_by_an_error_is_finished_by_the_next_round(cli, tmp_path, publisher, registry,  # noqa: F811
                                                                     monkeypatch):
    """An error during a trial (here the first health check's I/O) ends that round only: the
    loop's next round finishes the trial, without waiting for the follower to restart."""
    import threading

    import slm
    from slm.errors import IOFailure
    from slm.ops.ship import follow as follow_mod

    comp = publisher.publish(1)
    dev = device(cli, tmp_path, publisher.public)
    real, calls = follow_mod.check_health, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise IOFailure("cannot read the store: Input/output error")
        return real(*args, **kwargs)

    monkeypatch.setattr(follow_mod, "check_health", flaky)
    rounds, stop = [], threading.Event()

    def on_round(result, error):
        rounds.append((None if result is None else result.outcome, None if error is None else str(error)))
        if len(rounds) == 2:
            stop.set()

    slm.Store.open(dev).follow(f"{registry.host}/{REPO}:prod", insecure=True, interval="1s", on_round=on_round,
                               stop=stop)
    assert rounds[0][0] is None and "Input/output" in rounds[0][1]
    assert rounds[1] == ("updated", None), rounds
    assert state(dev)["good"]["composition"] == comp and state(dev)["trial"] is None


def test_a_bad_composition_re_signed_with_a_higher_version_is_not_tried_again(cli, tmp_path, publisher,  # noqa: F811
                                                                             registry):
    """"Never retried unless an operator clears it": not under a new version either."""
    good = publisher.publish(1)
    dev = device(cli, tmp_path, publisher.public)
    assert follow(cli, dev, registry.host).code == 0
    bad = publisher.publish(2)
    _reject(dev, bad)
    r = follow(cli, dev, registry.host)
    assert r.code == 18 and r.json()["outcome"] == "rolled-back", r.err
    assert [b["composition"] for b in state(dev)["bad"]] == [bad]
    assert cli("--store", dev, "status", "--json").json()["active"]["id"] == good
    publisher.publish(3, adapter=2)  # the same composition, a higher version
    before = _files(dev)
    again = follow(cli, dev, registry.host)
    assert again.code == 18 and again.json()["outcome"] == "known-bad", again.out
    assert _files(dev) == before
    # the operator clears it: tried again (and rejected again by the same script)
    assert cli("--store", dev, "follow", "--clear-bad").code == 0
    assert follow(cli, dev, registry.host).json()["outcome"] == "rolled-back"


def test_gc_keeps_what_a_roll_back_needs(cli, tmp_path, publisher, registry):  # noqa: F811
    good = publisher.publish(1)
    dev = device(cli, tmp_path, publisher.public)
    assert follow(cli, dev, registry.host).code == 0
    assert cli("--store", dev, "gc", "--prune-now").code == 0
    bad = publisher.publish(2)
    _reject(dev, bad)
    assert follow(cli, dev, registry.host).code == 18
    assert cli("--store", dev, "gc", "--prune-now").code == 0
    assert cli("--store", dev, "status", "--json").json()["active"]["id"] == good
    assert cli("--store", dev, "fsck").code == 0
    assert cli("--store", dev, "health").code == 0


def test_an_operator_and_a_second_follower_during_a_trial(cli, tmp_path, publisher, registry):  # noqa: F811
    """While a follower is in a trial (paused just after activating it): a second follower is
    refused (exit 7), --forget is refused, fsck reports no abandoned trial, and --clear-bad
    (an operator's ordinary act) changes the state under the follower, whose next round then
    finishes the trial instead of reporting it pending for ever."""
    import subprocess
    import sys
    import threading

    publisher.publish(1)
    dev = device(cli, tmp_path, publisher.public)
    assert follow(cli, dev, registry.host).code == 0
    bad = publisher.publish(2)
    _reject(dev, bad)
    assert follow(cli, dev, registry.host).code == 18
    new = publisher.publish(4, adapter=3)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "SLM_FAULTS": "pause@point=follow.activated",
           "SLM_FAULTS_PAUSE_S": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "slm", "--store", str(dev), "follow", f"{registry.host}/{REPO}:prod",
                             "--insecure", "--json", "--interval", "1s"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    done = threading.Event()

    def read_rounds():
        for line in proc.stdout:
            lines.append(line)
            if '"updated"' in line:
                done.set()

    threading.Thread(target=read_rounds, daemon=True).start()
    try:
        assert "slm-fault paused follow.activated" in proc.stderr.readline()
        assert cli("--store", dev, "follow", "--status", "--json").json()["following"]
        assert follow(cli, dev, registry.host).code == 7
        assert cli("--store", dev, "follow", "--forget").code == 7
        assert "follow-trial" not in cli("--store", dev, "fsck", "--json").out
        assert cli("--store", dev, "follow", "--clear-bad", "--json").json() == {"cleared": 1}
        assert done.wait(120), lines  # a hang guard: the trial is finished by a later round
    finally:
        proc.terminate()
        proc.wait(30)
    assert state(dev)["good"]["composition"] == new and state(dev)["trial"] is None
    assert cli("--store", dev, "status", "--json").json()["active"]["id"] == new


def test_a_higher_version_of_the_running_composition_is_recorded_without_a_trial(cli, tmp_path, publisher,  # noqa: F811
                                                                                 registry):
    """A publisher that re-signs what runs under a higher version (to refresh its expiry) is not
    a new composition to try: on the base it was put on trial again, and a check that failed
    this time (a flaky health.d script) marked the running composition bad while it ran on."""
    comp = publisher.publish(10, adapter=4)
    dev = device(cli, tmp_path, publisher.public)
    assert follow(cli, dev, registry.host).code == 0
    _reject(dev, comp)
    publisher.publish(11, adapter=4)
    r = follow(cli, dev, registry.host)
    assert r.code == 0 and r.json()["outcome"] == "current", (r.code, r.out, r.err)
    s = state(dev)
    assert (s["good"]["composition"], s["good"]["version"], s["bad"], s["trial"]) == (comp, 11, [], None)
    assert cli("--store", dev, "status", "--json").json()["active"]["id"] == comp


def _proxy_to(upstream: str, lie):
    """A FakeRegistry hook: every request answered by `upstream` (a real registry), except those
    `lie(handler, path)` answers itself (it returns True then)."""
    import urllib.error
    import urllib.request

    def misbehave(handler) -> bool:
        if lie(handler, handler.path):
            return True
        request = urllib.request.Request(f"http://{upstream}{handler.path}", method=handler.command,
                                         headers={"Accept": handler.headers.get("Accept", "*/*")})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                body, status, kind = resp.read(), resp.status, resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            body, status, kind = err.read(), err.code, err.headers.get("Content-Type", "")
        handler.reply(status, body, [("Content-Type", kind)])
        return True

    return misbehave


def _stall(handler) -> None:
    handler.server.stopping.wait(180)
    handler.close_connection = True


def _lies(other_manifest: bytes):
    """Each hostile answer, keyed by its name: (hook(handler, path) -> answered?, exit code)."""
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + f"{i:064x}", "size": 500,
         "artifactType": "application/vnd.slm.signature.v1+json"} for i in range(5000)]}).encode()

    def swap(handler, path):  # the tag resolves to one manifest, its digest serves another
        if "/manifests/sha256:" in path:
            handler.reply(200, other_manifest, [("Content-Type", "application/vnd.oci.image.manifest.v1+json")])
            return True
        return False

    def flood(handler, path):  # a referrers index of thousands of entries (over a megabyte)
        if "/referrers/" in path:
            handler.reply(200, index, [("Content-Type", "application/vnd.oci.image.index.v1+json")])
            return True
        return False

    def stall(where):
        def hook(handler, path):
            if where in path:
                _stall(handler)
                return True
            return False
        return hook

    return {"swap-after-resolve": (swap, (5,)), "referrers-flood": (flood, (4, 12)),
            "referrers-stall": (stall("/referrers/"), (12,)), "config-stall": (stall("/blobs/"), (12,))}


@pytest.mark.parametrize("name", ["swap-after-resolve", "referrers-flood", "referrers-stall", "config-stall"])
def test_a_lying_registry_is_refused_with_the_store_unchanged(tmp_path, cli, publisher, registry, name):  # noqa: F811
    import subprocess
    import sys

    from fake_registry import FakeRegistry

    publisher.publish(1)
    other = publisher.publish(2, tag="other")
    assert other
    from slm.distribution.reference import parse_reference
    from slm.distribution.registry import Registry

    client = Registry(parse_reference(f"{registry.host}/{REPO}:other"), True)
    try:
        other_manifest = client.get_manifest("other")
    finally:
        client.close()
    lie, codes = _lies(other_manifest)[name]
    dev = device(cli, tmp_path, publisher.public)
    before = _files(dev)
    env = {k: v for k, v in os.environ.items() if k not in ("SLM_FAULTS", "SLM_REGISTRY_AUTH")}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), SLM_REGISTRY_TIMEOUT_S="2", SLM_REGISTRY_MIN_RATE="1000",
               DOCKER_CONFIG=str(tmp_path / "none"))
    with FakeRegistry(misbehave=_proxy_to(registry.host, lie)) as fake:
        r = subprocess.run([sys.executable, "-m", "slm", "--store", str(dev), "follow", f"{fake.host}/{REPO}:prod",
                            "--once", "--insecure"], env=env, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert r.returncode in codes and one_line(r.stderr) and "internal error" not in r.stderr, (r.returncode, r.stderr)
    assert _files(dev) == {**before, **{k: v for k, v in _files(dev).items() if k.startswith("follow")}}
    assert "follow/state.json" not in _files(dev)


def test_a_statement_for_another_composition_under_the_tag_is_wrong_target(tmp_path, cli, publisher,  # noqa: F811
                                                                          registry):
    """Mix-and-match: the registry attaches to the tag's manifest a genuine statement for the
    tag that names another composition. docs/distribution.md's table: wrong-target, exit 17
    (on the base, the referrer check refused it first as a bad signature, exit 5)."""
    import hashlib
    import subprocess
    import sys
    import urllib.request

    from fake_registry import FakeRegistry

    publisher.publish(20, tag="elsewhere", signed_tag="prod", adapter=1)  # X: a statement for prod
    publisher.publish(21, tag="prod", adapter=2)  # Y: what the tag names

    def get(path, accept):
        request = urllib.request.Request(f"http://{registry.host}/v2/{REPO}/{path}", headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.read()

    oci_manifest, oci_index = "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json"
    x_manifest, y_manifest = get("manifests/elsewhere", oci_manifest), get("manifests/prod", oci_manifest)
    x_digest = "sha256:" + hashlib.sha256(x_manifest).hexdigest()
    y_digest = "sha256:" + hashlib.sha256(y_manifest).hexdigest()
    x_referrers = json.loads(get(f"manifests/{x_digest.replace(':', '-')}", oci_index))["manifests"]
    x_statement = None
    for entry in x_referrers:
        referrer = json.loads(get(f"manifests/{entry['digest']}", oci_manifest))
        blob = get(f"blobs/{referrer['layers'][0]['digest']}", "*/*")
        if b'"slm.statement/1"' in blob and b'"version":20' in blob:
            x_statement = referrer
    assert x_statement is not None
    forged = json.dumps({**x_statement, "subject": {"mediaType": oci_manifest, "digest": y_digest,
                                                    "size": len(y_manifest)}}).encode()
    forged_digest = "sha256:" + hashlib.sha256(forged).hexdigest()
    index = json.dumps({"schemaVersion": 2, "mediaType": oci_index, "manifests": [
        {"mediaType": oci_manifest, "digest": forged_digest, "size": len(forged),
         "artifactType": x_statement["artifactType"]}]}).encode()

    def lie(handler, path):
        if path.endswith(f"/manifests/{y_digest.replace(':', '-')}"):
            handler.reply(200, index, [("Content-Type", oci_index)])
        elif path.endswith(f"/manifests/{forged_digest}"):
            handler.reply(200, forged, [("Content-Type", oci_manifest)])
        else:
            return False
        return True

    dev = device(cli, tmp_path, publisher.public)
    before = _files(dev)
    env = {k: v for k, v in os.environ.items() if k not in ("SLM_FAULTS", "SLM_REGISTRY_AUTH")}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), DOCKER_CONFIG=str(tmp_path / "none"))
    with FakeRegistry(misbehave=_proxy_to(registry.host, lie)) as fake:
        r = subprocess.run([sys.executable, "-m", "slm", "--store", str(dev), "follow", f"{fake.host}/{REPO}:prod",
                            "--once", "--insecure"], env=env, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert r.returncode == 17 and one_line(r.stderr) and "composition" in r.stderr, (r.returncode, r.stderr)
    assert _files(dev) == before


def test_a_malformed_statement_beside_a_good_one(tmp_path, cli, publisher, registry):  # noqa: F811
    """Anyone who can push a referrer to the repository adds a statement that does not parse
    beside the publisher's: the statements are still judged, each on its own (on the base their
    fetch refused them all); the round then ends at the pull, whose policy refuses every
    signature referrer that does not verify: one line, nothing received."""
    import hashlib
    import subprocess
    import sys
    import urllib.request

    from fake_registry import FakeRegistry

    comp = publisher.publish(30, tag="prod", adapter=3)

    def get(path, accept):
        request = urllib.request.Request(f"http://{registry.host}/v2/{REPO}/{path}", headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.read()

    oci_manifest, oci_index = "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json"
    manifest = get("manifests/prod", oci_manifest)
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = json.loads(get(f"manifests/{digest.replace(':', '-')}", oci_index))
    some = json.loads(get(f"manifests/{index['manifests'][0]['digest']}", oci_manifest))
    junk = b'{"schema":"slm.statement/1","version":0}'
    junk_digest = "sha256:" + hashlib.sha256(junk).hexdigest()
    layer = {**some["layers"][0], "digest": junk_digest, "size": len(junk)}
    layer.pop("annotations", None)
    forged = json.dumps({**some, "layers": [layer]}).encode()
    forged_digest = "sha256:" + hashlib.sha256(forged).hexdigest()
    index["manifests"].append({"mediaType": oci_manifest, "digest": forged_digest, "size": len(forged),
                               "artifactType": some["artifactType"]})
    served = json.dumps(index).encode()

    def lie(handler, path):
        if path.endswith(f"/manifests/{digest.replace(':', '-')}"):
            handler.reply(200, served, [("Content-Type", oci_index)])
        elif path.endswith(f"/manifests/{forged_digest}"):
            handler.reply(200, forged, [("Content-Type", oci_manifest)])
        elif path.endswith(f"/blobs/{junk_digest}"):
            handler.reply(200, junk, [("Content-Type", "application/octet-stream")])
        else:
            return False
        return True

    dev = device(cli, tmp_path, publisher.public)
    before = _files(dev)
    env = {k: v for k, v in os.environ.items() if k not in ("SLM_FAULTS", "SLM_REGISTRY_AUTH")}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), DOCKER_CONFIG=str(tmp_path / "none"))
    with FakeRegistry(misbehave=_proxy_to(registry.host, lie)) as fake:
        from slm.distribution.statement import Reason, check_statements
        from slm.ops.ship import statements
        from slm.distribution.reference import parse_reference
        from slm.distribution.registry import Registry

        client = Registry(parse_reference(f"{fake.host}/{REPO}:prod"), True)
        try:
            found = statements.fetch_statements(client, digest)
        finally:
            client.close()
        r = subprocess.run([sys.executable, "-m", "slm", "--store", str(dev), "follow", f"{fake.host}/{REPO}:prod",
                            "--once", "--insecure", "--json"], env=env, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert junk in found and any(getattr(x, "version", None) == 30 for x in found)
    verdict = check_statements(found, repository=REPO, tag="prod", now=time.time(), running=None,
                               trusted_keys=[publisher.public], composition=comp)
    assert verdict.reason is Reason.NEWER and verdict.statement.version == 30
    assert r.returncode == 4 and one_line(r.stderr) and "referrer" in r.stderr, (r.returncode, r.stderr)
    assert _files(dev) == before
