"""Hostile registries (issue 30): what `slm pull` / `slm push` do when the registry on the other
end is the attacker. Fake registries on loopback (tests/distribution/fake_registry.py) serve a real exported
bundle and misbehave on cue.

The promises checked: credentials go only to the origin they were given for (scheme, host,
port), never over plain HTTP after HTTPS; every network operation is bounded by a deadline and
a minimum rate; whatever the server sends, the command fails with one line, exit 12, and the
store unchanged; no credential is ever printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from fake_registry import FakeRegistry, basic, blobs_redirected_to, read_layout, self_signed_cert
from helpers import one_line, snapshot, tiny_store

pytestmark = pytest.mark.hostile

SLM = [sys.executable, "-m", "slm"]
HANG = 90  # seconds: a pull of the tiny bundle that takes longer than this is a hang
SECRET = "hunter2-s3cret"
REPO = "fleet/tiny"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_model):
    """The tiny base with one adapter, active in a store and exported as an OCI layout:
    (manifest, blobs, the store)."""
    root = tmp_path_factory.mktemp("hostile-registry")
    store = tiny_store(root, tiny_model, {"a1": 3}, [("activate", "tq", "a1"), ("export", "-o", root / "layout")])
    return (*read_layout(root / "layout"), store)


@pytest.fixture
def empty_store(cli, tmp_path):
    store = tmp_path / "receiver"
    assert cli("--store", store, "init").code == 0
    return store


@pytest.fixture
def no_docker_config(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    monkeypatch.delenv("SLM_REGISTRY_AUTH", raising=False)


def pull_refused(cli, store, reference, *flags):
    """`slm pull` fails: exit 12, one line (no escape character, no internal error), store unchanged."""
    before = snapshot(store)
    r = cli("--store", store, "pull", reference, *flags)
    assert r.code == 12, (r.code, r.err)
    assert one_line(r.err) and "\x1b" not in r.err and "internal error" not in r.err, r.err
    assert snapshot(store) == before
    return r


def blob_paths(seen, scheme=None):
    return [s for s in seen if "/blobs/" in s.path and (scheme is None or s.scheme == scheme)]


# ------------------------------------------------------------------ credentials and origins

@pytest.fixture
def trusted_cert(monkeypatch, tmp_path, no_docker_config):
    """A test certificate for 127.0.0.1 the client trusts (SSL_CERT_FILE), and credentials."""
    cert = self_signed_cert(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert[0]))
    monkeypatch.setenv("SLM_REGISTRY_AUTH", f"alice:{SECRET}")
    return cert


@pytest.fixture
def https_registry(monkeypatch, trusted_cert):
    """... and 127.0.0.1 treated as a remote host (HTTPS), as registry.example.com would be."""
    from slm.distribution.reference import Reference

    monkeypatch.setattr(Reference, "is_loopback", property(lambda self: False))
    return trusted_cert


def test_https_registry_with_basic_auth_pulls_over_tls(cli, bundle, empty_store, https_registry):
    """The control for the downgrade test below: the same fake registry, no redirect, succeeds."""
    manifest, blobs, _ = bundle
    with FakeRegistry(manifest, blobs, password=basic("alice", SECRET), tls=https_registry) as reg:
        r = cli("--store", empty_store, "pull", f"{reg.host}/{REPO}:v1", "--json")
    assert r.code == 0, r.err
    assert {s.scheme for s in reg.seen} == {"https"} and blob_paths(reg.seen)
    assert SECRET not in r.out + r.err


def test_https_to_http_redirect_on_the_same_host_gets_no_credentials(cli, bundle, empty_store, https_registry):
    """Issue 30: an HTTPS registry answering blob GETs with `307 Location: http://SAME-HOST/...`
    received the next requests in cleartext with `Authorization: Basic ...`, and pull exited 0."""
    manifest, blobs, _ = bundle

    def downgrade(handler):
        if handler.scheme == "https" and "/blobs/" in handler.path:
            handler.reply(307, headers=[("Location", f"http://{handler.server.host}{handler.path}")])
            return True
        return False

    with FakeRegistry(manifest, blobs, misbehave=downgrade, password=basic("alice", SECRET),
                      tls=https_registry) as reg:
        r = pull_refused(cli, empty_store, f"{reg.host}/{REPO}:v1")
    assert "plain HTTP" in r.err and SECRET not in r.out + r.err
    assert any(s.scheme == "https" and s.authorization for s in reg.seen)  # authenticated over TLS first
    assert blob_paths(reg.seen, "https")  # ... and reached the redirect
    assert [s for s in reg.seen if s.scheme == "http"] == []  # the downgrade was never followed


def _bounce(handler):
    """Blob GETs: plain HTTP -> HTTPS (hop 1) -> plain HTTP again (hop 2), all on the same port;
    hop 2 is served whatever its credentials (the test looks at what it was sent)."""
    if "/blobs/" not in handler.path:
        return False
    path, _, hop = handler.path.partition("?hop=")
    if handler.scheme == "http" and not hop:
        handler.reply(307, headers=[("Location", f"https://{handler.server.host}{path}?hop=1")])
    elif handler.scheme == "https" and hop == "1":
        handler.reply(307, headers=[("Location", f"http://{handler.server.host}{path}?hop=2")])
    else:
        handler.reply(200, handler.server.blobs[path.rsplit("/", 1)[-1]])
    return True


@pytest.mark.parametrize("insecure", [False, True])
def test_a_downgrade_is_refused_and_with_insecure_followed_without_credentials(cli, bundle, empty_store,
                                                                               trusted_cert, insecure):
    """A plain-HTTP (loopback) registry whose blob redirect goes to HTTPS and back to plain HTTP:
    the way back is a downgrade, refused even to the registry's own origin; with --insecure it
    is followed, and nothing after the downgrade carries the credentials."""
    manifest, blobs, _ = bundle
    with FakeRegistry(manifest, blobs, misbehave=_bounce, password=basic("alice", SECRET), tls=trusted_cert) as reg:
        ref = f"{reg.host}/{REPO}:v1"
        if insecure:
            r = cli("--store", empty_store, "pull", ref, "--insecure")
            assert r.code == 0, r.err
        else:
            r = pull_refused(cli, empty_store, ref)
            assert "plain HTTP" in r.err
    hop1 = [s for s in reg.seen if s.path.endswith("?hop=1")]
    hop2 = [s for s in reg.seen if s.path.endswith("?hop=2")]
    assert hop1 and all(s.scheme == "https" for s in hop1)
    assert [s.authorization for s in hop1 + hop2] == [""] * len(hop1 + hop2)
    assert bool(hop2) == insecure


def test_credentials_never_reach_another_origin(cli, bundle, empty_store, no_docker_config, monkeypatch):
    """A blob redirect to another origin (another port of the same host) is followed without the
    registry's credentials; the pull succeeds with the storage's bytes."""
    manifest, blobs, _ = bundle
    monkeypatch.setenv("SLM_REGISTRY_AUTH", f"alice:{SECRET}")
    with FakeRegistry(manifest, blobs) as storage:
        with FakeRegistry(manifest, {}, misbehave=blobs_redirected_to(storage), password=basic("alice", SECRET)) as reg:
            r = cli("--store", empty_store, "pull", f"{reg.host}/{REPO}:v1")
    assert r.code == 0, r.err
    assert blob_paths(storage.seen) and [s.authorization for s in storage.seen] == [""] * len(storage.seen)


def test_plain_http_token_realm_on_another_origin_gets_no_credentials(cli, bundle, empty_store, no_docker_config,
                                                                      monkeypatch):
    """A Bearer challenge naming a realm on another origin over plain HTTP: refused before the
    Basic credentials are sent there (an HTTPS realm would receive them: the token flow)."""
    manifest, blobs, _ = bundle
    monkeypatch.setenv("SLM_REGISTRY_AUTH", f"alice:{SECRET}")
    with FakeRegistry() as tokens:
        def bearer(handler):
            handler.reply(401, headers=[("WWW-Authenticate",
                                         f'Bearer realm="http://{tokens.host}/token",service="fake"')])
            return True

        with FakeRegistry(manifest, blobs, misbehave=bearer) as reg:
            r = pull_refused(cli, empty_store, f"{reg.host}/{REPO}:v1")
    assert "token realm" in r.err and SECRET not in r.out + r.err
    assert tokens.seen == []


def test_https_token_realm_on_another_origin_receives_the_basic_credentials(cli, bundle, empty_store,
                                                                            https_registry):
    """The distribution token flow, as documented: the realm (HTTPS, another port) gets the
    Basic credentials, the registry gets only the token."""
    manifest, blobs, _ = bundle
    with FakeRegistry(tls=https_registry) as tokens:
        def token(handler):
            if handler.path.startswith("/token") and handler.headers.get("Authorization") == basic("alice", SECRET):
                handler.reply(200, b'{"token":"tok-1"}', [("Content-Type", "application/json")])
                return True
            return False

        tokens.misbehave = token

        def bearer(handler):
            if handler.headers.get("Authorization") != "Bearer tok-1":
                handler.reply(401, headers=[("WWW-Authenticate", f'Bearer realm="https://{tokens.host}/token"')])
                return True
            return False

        with FakeRegistry(manifest, blobs, misbehave=bearer, tls=https_registry) as reg:
            r = cli("--store", empty_store, "pull", f"{reg.host}/{REPO}:v1")
    assert r.code == 0, r.err
    assert {s.authorization for s in tokens.seen} == {basic("alice", SECRET)}
    assert {s.scheme for s in tokens.seen} == {"https"}
    assert {s.authorization for s in reg.seen} <= {"", "Bearer tok-1"}


@pytest.mark.parametrize("reference", [f"alice:{SECRET}@127.0.0.1:9/{REPO}:v1",
                                       f"alice:hun/{SECRET}@127.0.0.1:9/{REPO}:v1",
                                       f"alice:{SECRET}@127.0.0.1:9/{REPO}@sha256:{'a' * 64}"])
@pytest.mark.parametrize("command", ["push", "pull"])
def test_a_password_in_a_reference_is_never_printed(cli, empty_store, reference, command):
    """Issue 30: `slm push 'alice:hunter2@host/x:v1'` echoed the password in its error."""
    before = snapshot(empty_store)
    for flags in ((), ("--json",)):
        r = cli("--store", empty_store, command, reference, *flags)
        assert r.code == 4 and one_line(r.err), r.err
        assert SECRET not in r.out + r.err and "credentials" in r.err
    assert snapshot(empty_store) == before


# ------------------------------------------------------------------ deadlines


def _trickle(where):
    """A registry that answers one byte at a time (of its headers, or of its body), slowly, for
    far longer than the test waits (until the client goes away or the test ends)."""

    def misbehave(handler):
        head = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 4096 + b"\r\nContent-Length: 4096\r\n\r\n"
        if where == "body":
            handler.wfile.write(head)
            head = b"{" * 4096
        for i in range(len(head)):
            if handler.server.stopping.wait(0.25):
                break
            try:
                handler.wfile.write(head[i:i + 1])
                handler.wfile.flush()
            except OSError:
                break
        handler.close_connection = True
        return True

    return misbehave


def _stall(handler):
    """Reads the request, answers nothing, until the test ends."""
    handler.server.stopping.wait(HANG * 2)
    handler.close_connection = True
    return True


@pytest.mark.parametrize("command,misbehave", [("pull", _trickle("body")), ("pull", _trickle("headers")),
                                               ("push", _stall)], ids=["pull-body", "pull-headers", "push-stall"])
def test_a_registry_that_trickles_or_stalls_is_cut_off_by_the_deadline(empty_store, bundle, tmp_path,
                                                                       command, misbehave):
    """Issue 30: a registry sending 1 byte every 5 s kept `slm pull` running past 150 s (the
    timeout was per socket read). Here the deadline is 1 s plus 1 s per 1000 bytes: the command
    must end with exit 12 while the registry would keep trickling for minutes."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLM_FAULTS", "SLM_DEBUG", "SLM_REGISTRY_AUTH")}
    env.update(SLM_REGISTRY_TIMEOUT_S="1", SLM_REGISTRY_MIN_RATE="1000", DOCKER_CONFIG=str(tmp_path / "none"))
    store = bundle[2] if command == "push" else empty_store  # push reads its store, pull writes one
    before = snapshot(store)
    with FakeRegistry(misbehave=misbehave) as reg:
        r = subprocess.run([*SLM, "--store", str(store), command, f"{reg.host}/{REPO}:v1"], env=env,
                           capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL)
        assert reg.seen, "the registry was never asked"
    assert r.returncode == 12 and one_line(r.stderr), r.stderr
    assert "too slow" in r.stderr and "SLM_REGISTRY_MIN_RATE" in r.stderr
    assert snapshot(store) == before


def test_a_steady_transfer_longer_than_the_timeout_is_not_cut(no_docker_config, monkeypatch):
    """The deadline grows with the bytes moved: a blob that arrives above the minimum rate, but
    takes several times SLM_REGISTRY_TIMEOUT_S in all, is received whole."""
    import hashlib

    from slm.distribution.reference import parse_reference
    from slm.distribution.registry import Registry

    monkeypatch.setenv("SLM_REGISTRY_TIMEOUT_S", "1")
    monkeypatch.setenv("SLM_REGISTRY_MIN_RATE", "1000")
    blob = bytes(range(256)) * 32  # 8 KiB: allowed 1 s + 8 s, sent in 16 pieces 0.25 s apart
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()

    def steady(handler):
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(blob))
        for start in range(0, len(blob), 512):
            handler.server.stopping.wait(0.25)
            handler.wfile.write(blob[start:start + 512])
            handler.wfile.flush()
        return True

    with FakeRegistry(misbehave=steady) as reg:
        client = Registry(parse_reference(f"{reg.host}/{REPO}:v1"))
        try:
            assert client.get_blob(digest, len(blob)) == blob
        finally:
            client.close()


@pytest.mark.parametrize("name,value", [("SLM_REGISTRY_TIMEOUT_S", "nan"), ("SLM_REGISTRY_TIMEOUT_S", "0"),
                                        ("SLM_REGISTRY_MIN_RATE", "-5"), ("SLM_REGISTRY_MIN_RATE", "fast")])
def test_bad_deadline_settings_are_exit_4(cli, empty_store, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    r = cli("--store", empty_store, "pull", f"127.0.0.1:9/{REPO}:v1")
    assert r.code == 4 and one_line(r.err) and name in r.err, r.err


# ------------------------------------------------------------------ malformed responses

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n"
MALFORMED = {
    "over-100-headers": _HEAD + b"".join(b"X-H%d: v\r\n" % i for i in range(150)) + b"Content-Length: 2\r\n\r\n{}",
    "header-over-64k": _HEAD + b"X-Big: " + b"a" * 70000 + b"\r\nContent-Length: 2\r\n\r\n{}",
    "garbage-status": b"HTTP/1.1 2\x1b[31mOK garbage\r\nsecond line\r\n\r\n",
    "bad-chunked": _HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\x1b[2J\r\n{}\r\n0\r\n\r\n",
    "short-content-length": _HEAD + b"Content-Length: 1000\r\n\r\n{\"schemaVersion\"",
    "redirect-to-broken-ipv6": b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://[::1/x\r\nContent-Length: 0\r\n\r\n",
    "redirect-with-control-characters": b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /v2/x\x01y\r\n"
                                        b"Content-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("stage", ["manifest", "blob"])
@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_responses_are_one_line_exit_12(cli, bundle, empty_store, no_docker_config, kind, stage):
    """Issue 30: these exited 1 "internal error" (a garbage status line on two lines, the next
    request on the connection ResponseNotReady)."""
    manifest, blobs, _ = bundle

    def broken(handler):
        if f"/{stage}s/" in handler.path:
            handler.raw(MALFORMED[kind])
            return True
        return False

    with FakeRegistry(manifest, blobs, misbehave=broken) as reg:
        r = pull_refused(cli, empty_store, f"{reg.host}/{REPO}:v1")
    assert f"registry {reg.host}" in r.err or "registry 127.0.0.1" in r.err, r.err


def test_a_protocol_error_discards_the_connection(bundle, no_docker_config):
    """After a malformed response the connection is never read again: the next request opens a
    new one (a kept-alive connection would hand it the rest of the broken response)."""
    from slm.distribution.reference import parse_reference
    from slm.distribution.registry import Registry
    from slm.errors import IOFailure

    manifest, blobs, _ = bundle
    first = threading.Event()

    def once(handler):
        if not first.is_set():
            first.set()
            handler.raw(MALFORMED["over-100-headers"] + _HEAD + b"Content-Length: 2\r\n\r\n{}", close=False)
            return True
        return False

    with FakeRegistry(manifest, blobs, misbehave=once) as reg:
        client = Registry(parse_reference(f"{reg.host}/{REPO}:v1"))
        try:
            with pytest.raises(IOFailure, match="broken HTTP response"):
                client.get_manifest("v1")
            assert client.get_manifest("v1") == manifest
        finally:
            client.close()
    assert len(reg.seen) == 2 and reg.seen[0].client != reg.seen[1].client


def test_server_text_in_an_error_is_escaped_and_cut_short(cli, bundle, empty_store, no_docker_config):
    """A registry's error JSON is quoted in the message: one line, no escape sequence, bounded."""
    manifest, blobs, _ = bundle

    def denied(handler):
        message = "no\r\n\x1b[31m" + "x" * 100000
        handler.reply(500, json.dumps({"errors": [{"code": "DENIED\n\x07", "message": message}]}).encode())
        return True

    with FakeRegistry(manifest, blobs, misbehave=denied) as reg:
        r = pull_refused(cli, empty_store, f"{reg.host}/{REPO}:v1")
    assert "HTTP 500" in r.err and "\x07" not in r.err and len(r.err) < 1000, r.err


@pytest.mark.parametrize("location", ["http://[::1/x", "/v2/up\x01load", "https://user:pw@127.0.0.1:9/up"])
def test_a_malformed_upload_location_is_one_line_exit_12(cli, bundle, no_docker_config, location):
    """The Location of an upload session is a URL the registry chose: held to the same rules as
    a redirect (it exited 1 on a URL that does not parse)."""
    store = bundle[2]

    def upload_at(handler):
        if handler.command == "POST":
            handler.reply(202, headers=[("Location", location)])
            return True
        return False  # HEAD of a blob: 404, so push uploads it

    before = snapshot(store)
    with FakeRegistry(misbehave=upload_at) as reg:
        r = cli("--store", store, "push", f"{reg.host}/{REPO}:v1")
    assert r.code == 12 and one_line(r.err) and "internal error" not in r.err, r.err
    assert "user:pw" not in r.err
    assert any(s.method == "POST" for s in reg.seen)
    assert snapshot(store) == before
