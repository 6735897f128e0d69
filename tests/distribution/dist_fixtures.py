"""Fixtures of the distribution tests: a real OCI registry (Debian's docker-registry, i.e.
distribution 2.8) on a free loopback port with its own storage, stopped after; skopeo."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

APT_HINT = "(apt-get install docker-registry skopeo; `make test` installs them)"


@dataclass
class LocalRegistry:
    host: str  # 127.0.0.1:PORT
    storage: Path  # the registry's filesystem root

    def blob_path(self, sha256_digest: str) -> Path:
        hex_ = sha256_digest.removeprefix("sha256:")
        return self.storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / hex_[:2] / hex_ / "data"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_registry(root: Path, htpasswd: str | None = None):
    """docker-registry on a free 127.0.0.1 port with its storage under `root`; with `htpasswd`
    (a "user:bcrypt-hash" line) it asks for Basic auth."""
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.skip(f"docker-registry is not installed {APT_HINT}")
    port = _free_port()
    auth = ""
    if htpasswd is not None:
        (root / "htpasswd").write_text(htpasswd + "\n")
        auth = f"auth:\n  htpasswd:\n    realm: slm-test\n    path: {root / 'htpasswd'}\n"
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"  # loopback only
        + auth
    )
    log = open(root / "registry.log", "wb")
    proc = subprocess.Popen([exe, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120  # a hang guard: a loaded machine starts it late
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1):
                    break
            except urllib.error.HTTPError as err:  # 401: up, and asking for credentials
                if err.code == 401:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"docker-registry did not start: {(root / 'registry.log').read_text()[-500:]}")
            time.sleep(0.05)
        yield LocalRegistry(f"127.0.0.1:{port}", root / "data")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with local_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="session")
def skopeo():
    exe = shutil.which("skopeo")
    if exe is None:
        pytest.skip(f"skopeo is not installed {APT_HINT}")
    return exe


def _call(host: str, method: str, path: str, body: bytes = b"", headers=None):
    url = path if path.startswith("http") else f"http://{host}{path}"  # Location may be absolute
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    return urllib.request.urlopen(req, timeout=60)


def put_referrer(host: str, repo: str, subject_digest: str, subject_size: int, blob: bytes,
                 artifact_type: str | None = None, media_type: str | None = None) -> dict:
    """Push `blob` as a referrer manifest of the subject the way a third party would (plain HTTP
    requests, OCI distribution spec), by default as an slm signature; its index entry."""
    from slm.distribution import mediatypes as mt

    artifact_type = artifact_type or mt.ARTIFACT_SIGNATURE

    def put_blob(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        location = _call(host, "POST", f"/v2/{repo}/blobs/uploads/").headers["Location"]
        sep = "&" if "?" in location else "?"
        _call(host, "PUT", f"{location}{sep}digest={digest}", data, {"Content-Type": "application/octet-stream"})
        return digest

    referrer = json.dumps({
        "schemaVersion": 2, "mediaType": mt.OCI_MANIFEST, "artifactType": artifact_type,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": put_blob(b"{}"), "size": 2},
        "layers": [{"mediaType": media_type or mt.SIGNATURE, "digest": put_blob(blob), "size": len(blob)}],
        "subject": {"mediaType": mt.OCI_MANIFEST, "digest": subject_digest, "size": subject_size},
    }).encode()
    digest = "sha256:" + hashlib.sha256(referrer).hexdigest()
    _call(host, "PUT", f"/v2/{repo}/manifests/{digest}", referrer, {"Content-Type": mt.OCI_MANIFEST})
    return {"mediaType": mt.OCI_MANIFEST, "digest": digest, "size": len(referrer), "artifactType": artifact_type}


def put_referrers_index(host: str, repo: str, subject_digest: str, entries: list[dict]) -> None:
    """The OCI 1.1 fallback tag of the subject, listing `entries` (and nothing else)."""
    from slm.distribution import mediatypes as mt

    index = json.dumps({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": entries}).encode()
    _call(host, "PUT", f"/v2/{repo}/manifests/{subject_digest.replace(':', '-')}", index,
          {"Content-Type": mt.OCI_INDEX})


def attach_referrer(host: str, repo: str, subject_digest: str, subject_size: int, blob: bytes,
                    artifact_type: str | None = None, media_type: str | None = None) -> None:
    """`blob` as the one referrer of the subject (put_referrer, then the fallback tag)."""
    entry = put_referrer(host, repo, subject_digest, subject_size, blob, artifact_type, media_type)
    put_referrers_index(host, repo, subject_digest, [entry])


def manifest_size(host: str, repo: str, digest: str) -> int:
    """The size of a manifest the registry holds (a referrer's subject descriptor gives it)."""
    from slm.distribution import mediatypes as mt

    req = urllib.request.Request(f"http://{host}/v2/{repo}/manifests/{digest}", headers={"Accept": mt.OCI_MANIFEST})
    return len(urllib.request.urlopen(req, timeout=60).read())
