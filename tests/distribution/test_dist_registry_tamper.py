"""Pull from a real registry (docker-registry 2.8) refuses tampered storage, missing blobs and
bad references with one line and the store unchanged (on the tiny model: fast)."""

from __future__ import annotations

import json

import pytest

from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import TINY_LORA, one_line, snapshot, tiny_store

@pytest.fixture(scope="module")
def pushed(tmp_path_factory, registry, tiny_model):  # noqa: F811
    root = tmp_path_factory.mktemp("tiny-push")
    a = tiny_store(root, tiny_model, {"demo": 6}, [("activate", "tiny", "demo")], bases={"tiny": "gguf"},
                   lora=TINY_LORA, store=root / "a")
    return {"store": a, "ref": f"{registry.host}/fleet/tiny:v1"}


def _json(cli, *args):
    r = cli(*args, "--json")
    assert r.code == 0, r.err
    return r.json()


def test_pull_refuses_a_flipped_byte_in_registry_storage(cli, tmp_path, registry, pushed):  # noqa: F811
    pushed_json = _json(cli, "--store", pushed["store"], "push", pushed["ref"].replace(":v1", ":tamper"))
    manifest = json.loads(registry.blob_path(pushed_json["manifest_digest"]).read_bytes())
    victim = registry.blob_path(manifest["layers"][8]["digest"])
    original = victim.read_bytes()
    try:
        data = bytearray(original)
        data[len(data) // 2] ^= 0x10
        victim.write_bytes(bytes(data))
        e = tmp_path / "e"
        assert cli("--store", e, "init").code == 0
        before = snapshot(e)
        r = cli("--store", e, "pull", pushed["ref"].replace(":v1", ":tamper"))
        assert r.code == 5 and one_line(r.err) and "sha256" in r.err
        assert snapshot(e) == before
    finally:
        victim.write_bytes(original)


def test_pull_refuses_a_manifest_whose_blob_is_missing(cli, tmp_path, registry, pushed):  # noqa: F811
    pushed_json = _json(cli, "--store", pushed["store"], "push", pushed["ref"].replace(":v1", ":missing"))
    manifest = json.loads(registry.blob_path(pushed_json["manifest_digest"]).read_bytes())
    victim = registry.blob_path(manifest["layers"][-1]["digest"])
    saved = tmp_path / "saved"
    victim.rename(saved)
    try:
        f = tmp_path / "f"
        assert cli("--store", f, "init").code == 0
        before = snapshot(f)
        r = cli("--store", f, "pull", pushed["ref"].replace(":v1", ":missing"))
        assert r.code in (3, 5) and one_line(r.err), r.err
        assert snapshot(f) == before
    finally:
        saved.rename(victim)


def test_bad_references_and_an_unknown_tag_are_one_line_errors(cli, tmp_path, registry, pushed):  # noqa: F811
    for ref, code in [("no-host-here", 4), (f"{registry.host}/Upper/Case:v1", 4),
                      (f"{registry.host}/fleet/tiny@sha256:1234", 4), (f"{registry.host}/fleet/none:v9", 3),
                      ("127.0.0.1:1/fleet/tiny:v1", 12)]:
        r = cli("--store", pushed["store"], "pull", ref)
        assert r.code == code and one_line(r.err), (ref, r.code, r.err)


def test_plain_http_is_refused_for_a_remote_host_without_insecure():
    from slm.distribution.reference import parse_reference
    from slm.distribution.registry import Registry

    assert Registry(parse_reference("registry.example.com/a/b:v1")).scheme == "https"
    assert Registry(parse_reference("registry.example.com/a/b:v1"), insecure=True).scheme == "http"
    assert Registry(parse_reference("127.0.0.1:5000/a/b:v1")).scheme == "http"
    assert Registry(parse_reference("[::1]:5000/a/b")).scheme == "http"


def test_basic_auth_from_env_or_docker_config_and_never_printed(cli, tmp_path, tiny_model, monkeypatch, pushed):
    """A registry that asks for Basic auth (htpasswd): refused without credentials (exit 12),
    accepted with SLM_REGISTRY_AUTH or ~/.docker/config.json; the password is never printed."""
    import base64
    import warnings

    from dist_fixtures import local_registry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # the system's bcrypt, with a fixed salt: a deterministic htpasswd line
    secret = "s3cret-pw-9f2"
    line = "fleet:" + crypt.crypt(secret, "$2b$05$" + "slmtestsaltslmtestsalt")
    (tmp_path / "reg").mkdir()
    with local_registry(tmp_path / "reg", htpasswd=line) as reg:
        ref = f"{reg.host}/fleet/tiny:auth"
        monkeypatch.delenv("SLM_REGISTRY_AUTH", raising=False)
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
        r = cli("--store", pushed["store"], "push", ref)
        assert r.code == 12 and one_line(r.err) and "access denied" in r.err
        monkeypatch.setenv("SLM_REGISTRY_AUTH", f"fleet:{secret}")
        r = cli("--store", pushed["store"], "push", ref, "--json")
        assert r.code == 0, r.err
        assert secret not in r.out + r.err
        monkeypatch.setenv("SLM_REGISTRY_AUTH", "fleet:wrong")
        r = cli("--store", pushed["store"], "pull", ref)
        assert r.code == 12 and secret not in r.out + r.err and "wrong" not in r.err
        monkeypatch.delenv("SLM_REGISTRY_AUTH")
        docker = tmp_path / "docker"
        docker.mkdir()
        token = base64.b64encode(f"fleet:{secret}".encode()).decode()
        (docker / "config.json").write_text(json.dumps({"auths": {reg.host: {"auth": token}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(docker))
        b = tmp_path / "b"
        assert cli("--store", b, "init").code == 0
        r = cli("--store", b, "pull", ref, "--json")
        assert r.code == 0, r.err
        assert secret not in r.out + r.err and token not in r.out + r.err


def test_chunked_upload_and_pull_by_digest(cli, tmp_path, registry, pushed, monkeypatch):  # noqa: F811
    """Blobs over CHUNK go up in PATCH chunks (4 KiB here, so most tiny tensors do); a pull by
    @sha256:<manifest digest> gets exactly that manifest."""
    from slm.distribution import registry as client

    monkeypatch.setattr(client, "CHUNK", 4096)
    ref = pushed["ref"].replace(":v1", ":chunked").replace("fleet/tiny", "fleet/chunked")
    up = _json(cli, "--store", pushed["store"], "push", ref)
    assert up["blobs_uploaded"] == up["layers"] + 1
    b = tmp_path / "b"
    assert cli("--store", b, "init").code == 0
    by_digest = ref.split(":chunked")[0] + "@" + up["manifest_digest"]
    got = _json(cli, "--store", b, "pull", by_digest)
    assert got["composition_id"] == up["composition_id"] and got["manifest_digest"] == up["manifest_digest"]
    assert cli("--store", b, "fsck").code == 0


def test_bearer_token_challenge_is_answered_and_the_token_never_shown():
    """The distribution token flow (a registry that answers 401 Bearer realm=...): the client
    fetches a token with its Basic credentials and retries with it; no credentials, no token."""
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from slm.distribution.reference import parse_reference
    from slm.distribution.registry import Credentials, Registry
    from slm.errors import IOFailure

    token, seen = "tok-7c1e9", []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, body=b"", headers=()):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            auth = self.headers.get("Authorization", "")
            seen.append((self.path.split("?")[0], auth.split(" ")[0]))
            if self.path.startswith("/token"):
                good = "Basic " + base64.b64encode(b"fleet:pw").decode()
                return self._send(200, json.dumps({"token": token}).encode()) if auth == good else self._send(401)
            if auth == f"Bearer {token}":
                return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}')
            realm = f"http://127.0.0.1:{self.server.server_port}/token"
            self._send(401, headers=[("WWW-Authenticate",
                                      f'Bearer realm="{realm}",service="t",scope="repository:fleet/x:pull"')])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ref = parse_reference(f"127.0.0.1:{server.server_port}/fleet/x:v1")
        client = Registry(ref, credentials=Credentials("fleet", "pw"))
        assert client.get_manifest("v1") is None  # authorised: the registry says 404
        assert ("/token", "Basic") in seen and ("/v2/fleet/x/manifests/v1", "Bearer") in seen
        client.close()
        with pytest.raises(IOFailure) as err:
            Registry(ref, credentials=Credentials("fleet", "wrong")).get_manifest("v1")
        assert "token service refused" in str(err.value) and token not in str(err.value)
    finally:
        server.shutdown()
