"""`slm serve --model REF` against a real registry (Debian's docker-registry): a signed
composition pulled by digest into fresh stores that require signatures, activated and served
with no `slm activate` of their own; replicas answer with one composition id; a restart on a
store that has the digest needs no registry; a moved tag is followed; a registry that cannot be
reached, a digest it does not hold and a signature the store does not trust each stop the server
before it listens, with one line and the documented exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

from dist_fixtures import _free_port, local_registry, registry  # noqa: F401  (fixture)
from helpers import tiny_store
from serve_helpers import Server
from test_dist_referrers import _ed25519_key

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def signed(tmp_path_factory, tiny_model):
    """Store A (tiny + a1@0.5 active, signed by key 7) and the key's public text."""
    from slm.cli import run

    root = tmp_path_factory.mktemp("signed")
    a = tiny_store(root, tiny_model, 1, steps=(("activate", "tq", "a1@0.5"),))
    key, public = _ed25519_key(root / "ci.pem", 7)
    assert run(["--store", str(a), "sign", "--key", str(key)]) == 0
    return a, public


def _push(cli, store: Path, ref: str) -> dict:
    r = cli("--store", store, "push", ref, "--json")
    assert r.code == 0, r.err
    return r.json()


def _fresh(cli, path: Path, trusted: str | None) -> Path:
    """A new store; with `trusted`, it requires compositions signed by that key."""
    assert cli("--store", path, "init").code == 0
    if trusted is not None:
        doc = tomlkit.parse((path / "config.toml").read_text())
        doc["require_signed"], doc["trusted_keys"] = True, [trusted]
        (path / "config.toml").write_text(tomlkit.dumps(doc))
    return path


def _answer(server: Server) -> tuple[str, str]:
    """(the slm-composition header, the system_fingerprint) of one chat completion."""
    status, headers, body = server.http("POST", "/v1/chat/completions", CHAT)
    assert status == 200, body
    return headers["slm-composition"], json.loads(body)["system_fingerprint"]


def _serve(store: Path, ref: str) -> Server:
    return Server(store, "--model", ref)


def test_replicas_pulling_one_digest_serve_one_composition_and_restart_without_the_registry(
        cli, tmp_path, signed):
    a, public = signed
    (tmp_path / "registry").mkdir()
    with local_registry(tmp_path / "registry") as reg:
        pushed = _push(cli, a, f"{reg.host}/fleet/smol:v1")
        ref = f"{reg.host}/fleet/smol@{pushed['manifest_digest']}"
        stores = [_fresh(cli, tmp_path / name, public) for name in ("b", "c")]
        servers = []  # two replicas running side by side, each on its own store
        try:
            for store in stores:
                servers.append(_serve(store, ref))
            for server in servers:
                assert any("activated; " in line for line in server.lines), server.lines
            answers = [_answer(server) for server in servers]
        finally:
            assert [server.stop() for server in servers] == [0] * len(servers)
    # every replica: the composition store A pushed, in the header and the fingerprint alike
    assert answers == [(pushed["composition_id"], pushed["composition_id"])] * 2
    for store in stores:
        assert cli("--store", store, "status", "--json").json()["active"]["id"] == pushed["composition_id"]
    # the registry is gone: a restart on a store that holds the digest does not need it
    server = _serve(stores[0], ref)
    try:
        assert any("already active; pulled before under this digest" in line for line in server.lines), server.lines
        assert _answer(server) == (pushed["composition_id"],) * 2
    finally:
        assert server.stop() == 0


def test_a_tag_is_resolved_again_at_each_start_and_a_digest_is_not(cli, tmp_path, tiny_model, registry):  # noqa: F811
    import slm

    a = tiny_store(tmp_path / "a", tiny_model, 1, steps=(("activate", "tq", "a1@0.5"),))
    tag = f"{registry.host}/fleet/moving:v1"
    first = _push(cli, a, tag)
    b = slm.Store.open(_fresh(cli, tmp_path / "b", None).as_posix())
    got = b.provision(tag)
    assert (got.composition_id, got.transition.changed) == (first["composition_id"], True)
    assert got.received.blobs_downloaded > 0
    again = b.provision(tag)  # asked again: the manifest and its small config, no layer; nothing switched
    assert again.received is not None and again.received.blobs_downloaded == 1
    assert again.received.blobs_reused == again.received.layers and again.received.bytes_downloaded < 4096
    assert (again.composition_id, again.transition.changed) == (first["composition_id"], False)

    assert cli("--store", a, "activate", "tq", "a1@0.25").code == 0
    moved = _push(cli, a, tag)
    assert moved["composition_id"] != first["composition_id"]
    now = b.provision(tag)
    assert (now.composition_id, now.transition.changed) == (moved["composition_id"], True)
    assert b.active().id == moved["composition_id"]
    pinned = b.provision(f"{registry.host}/fleet/moving@{first['manifest_digest']}")
    assert pinned.received is not None  # this digest was never pulled under its own reference
    assert b.provision(f"{registry.host}/fleet/moving@{first['manifest_digest']}").received is None
    assert b.active().id == first["composition_id"]


def _refused_start(store: Path, ref: str, code: int, says: str, *args: str) -> None:
    """`slm serve --model ref ARGS` exits `code` with one error line, and never listens."""
    proc = subprocess.run([sys.executable, "-m", "slm", "--store", str(store), "serve", "--port", "0",
                           "--model", ref, *args], capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("slm: error:") and says in lines[0], lines
    assert "listening" not in proc.stderr + proc.stdout


def test_a_registry_not_answering_a_missing_digest_and_an_untrusted_signer_stop_the_start(
        cli, tmp_path, signed, registry):  # noqa: F811
    a, public = signed
    pushed = _push(cli, a, f"{registry.host}/fleet/smol:v1")
    b = _fresh(cli, tmp_path / "b", public)
    unreachable = f"127.0.0.1:{_free_port()}/fleet/smol:v1"
    _refused_start(b, unreachable, 12, "127.0.0.1")
    # a bad option is refused before the registry is asked (else this would be 12)
    _refused_start(b, unreachable, 4, "--grace", "--grace", "-1")
    _refused_start(b, unreachable, 4, "memory budget", "--memory-budget", "lots")
    _refused_start(b, unreachable, 4, "--threads", "--threads", "0")
    _refused_start(b, f"{registry.host}/fleet/smol@sha256:{'0' * 64}", 3, "fleet/smol")
    _, other = _ed25519_key(tmp_path / "other.pem", 8)
    c = _fresh(cli, tmp_path / "c", other)
    _refused_start(c, f"{registry.host}/fleet/smol@{pushed['manifest_digest']}", 6, "untrusted")
    assert cli("--store", c, "status", "--json").json()["active"] is None


def test_the_deploy_manifests_slm_command_lines_run_as_written(cli, tmp_path, tiny_model, registry):  # noqa: F811
    """deploy/10-slm-serve.yaml's init containers and server, run in order on one store (the
    pod's), with the manifest's reference swapped for one this registry holds and the server
    kept on loopback: the store serves the pushed composition."""
    import os

    from test_deploy_manifests import slm_lines

    a = tiny_store(tmp_path / "a", tiny_model, 1, steps=(("activate", "tq", "a1@0.5"),))
    pushed = _push(cli, a, f"{registry.host}/fleet/deploy:v1")
    ref = f"{registry.host}/fleet/deploy@{pushed['manifest_digest']}"
    lines = slm_lines()
    (placeholder,) = {argv[1] for name, argv in lines if name == "pull"}
    store = tmp_path / "store"
    env = {**os.environ, "SLM_STORE": str(store)}
    *prepare, (_, serve) = [(name, [ref if w == placeholder else w for w in argv]) for name, argv in lines]
    for name, argv in prepare:
        done = subprocess.run([sys.executable, "-m", "slm", *argv], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, (name, done.stderr)
    flags = serve[1:]
    for flag in ("--host", "--port"):  # loopback, a free port
        i = flags.index(flag)
        del flags[i:i + 2]
    server = Server(store, "--host", "127.0.0.1", *flags)
    try:
        assert server.http("GET", "/health")[0] == 200
        assert _answer(server) == (pushed["composition_id"],) * 2
    finally:
        assert server.stop() == 0
