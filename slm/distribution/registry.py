"""A small OCI distribution-spec (registry v2) client over http.client.

    HEAD  /v2/<repo>/blobs/<digest>             is the blob there? (push skips it if so)
    POST  /v2/<repo>/blobs/uploads/             start an upload -> 202, Location
    PATCH <location>  Content-Range a-b         one chunk (blobs over CHUNK bytes)
    PUT   <location>?digest=<digest>            finish (monolithic: the whole body here)
    PUT   /v2/<repo>/manifests/<tag|digest>     Content-Type: the manifest's media type
    GET   /v2/<repo>/manifests/<ref>            Accept: the OCI manifest type
    GET   /v2/<repo>/blobs/<digest>             may redirect to storage (Authorization is not
                                                forwarded to another origin)

Auth: on a 401 from the registry's own origin (scheme, host, port) the WWW-Authenticate
challenge is answered, Basic with the credentials, or Bearer by fetching a token from the
realm (with the credentials, if any: over HTTPS, or from the registry's own origin); tokens
are held in memory only and never appear in a message. Credentials come from
SLM_REGISTRY_AUTH ("user:password") or ~/.docker/config.json ($DOCKER_CONFIG/config.json)
"auths", read as any file someone else wrote (slm.formats.untrusted: a regular file of at most
1 MiB, else exit 4). The wire (deadlines, origins, malformed responses) is slm.distribution.transport's.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from slm.distribution import mediatypes as mt
from slm.distribution.bundle import MAX_MANIFEST_BYTES, sha256_of
from slm.distribution.reference import Reference
from slm.distribution.transport import Clock, Response, Transport, join, origin_of, shown
from slm.errors import IntegrityError, InvalidInput, IOFailure, NotFound
from slm.formats.untrusted import read_untrusted

ENV_AUTH = "SLM_REGISTRY_AUTH"
CHUNK = 32 << 20  # blobs above this are uploaded in PATCH chunks of this size
MAX_REDIRECTS = 5
MAX_DOCKER_CONFIG_BYTES = 1 << 20
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode("ascii")


def credentials_for(host: str) -> Credentials | None:
    """SLM_REGISTRY_AUTH, else the host's entry in the Docker config file, else None."""
    env = os.environ.get(ENV_AUTH)
    if env:
        user, sep, password = env.partition(":")
        if not sep:
            raise InvalidInput(f"{ENV_AUTH} must be USER:PASSWORD")
        return Credentials(user, password)
    folder = os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
    path = Path(folder) / "config.json"
    try:  # a FIFO, a device or an oversize file there: exit 4, never a hang
        doc = json.loads(read_untrusted(path, MAX_DOCKER_CONFIG_BYTES, "Docker config file"))
    except (NotFound, IOFailure, ValueError):  # none, unreadable or not JSON: no credentials, as docker
        return None
    auths = doc.get("auths") if isinstance(doc, dict) else None
    entry = (auths.get(host) or auths.get(f"https://{host}")) if isinstance(auths, dict) else None
    if not isinstance(entry, dict):
        return None
    if isinstance(entry.get("auth"), str):
        try:
            user, sep, password = base64.b64decode(entry["auth"]).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            raise InvalidInput(f"{path}: the auth entry of {host} is not base64 user:password") from None
        if sep:
            return Credentials(user, password)
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return Credentials(entry["username"], entry["password"])
    return None


class Registry:
    def __init__(self, ref: Reference, insecure: bool = False, credentials: Credentials | None = None):
        self.insecure = insecure
        self.scheme = "http" if (ref.is_loopback or insecure) else "https"
        self.ref = ref
        self.base = f"{self.scheme}://{ref.host}"
        self.origin = origin_of(self.base, ref.host)  # the only origin the credentials go to
        self.credentials = credentials if credentials is not None else credentials_for(ref.host)
        self._auth_header: str | None = None
        self.transport = Transport(ref.host)

    def close(self) -> None:
        self.transport.close()

    def request(self, method: str, url: str, body: bytes | None = None, headers: dict | None = None,
                limit: int | None = 1 << 20, stream: bool = False) -> Response:
        """One request, answering an auth challenge and following redirects, all under one clock
        (slm.distribution.transport). Credentials, and the token they bought, go to the registry's own
        origin only (scheme, host and port): a redirect elsewhere is followed without them. With
        `stream`, the final 200 response's body is left to read (`Response.stream`)."""
        clock = self.transport.clock()
        headers = dict(headers or {})
        downgraded = False  # after an HTTPS -> HTTP redirect (--insecure), no credentials at all
        for _ in range(MAX_REDIRECTS + 1):
            ours = origin_of(url, self.ref.host) == self.origin and not downgraded
            sent = dict(headers)
            if ours and self._auth_header:
                sent["Authorization"] = self._auth_header
            resp = self.transport.send(method, url, body, sent, limit, clock, stream)
            if resp.status == 401 and ours and self._answer(resp.headers.get("www-authenticate", ""), clock):
                sent["Authorization"] = self._auth_header
                resp = self.transport.send(method, url, body, sent, limit, clock, stream)
            if resp.status in (301, 302, 303, 307, 308) and "location" in resp.headers and method in ("GET", "HEAD"):
                url, downgrade = self._redirect(url, resp.headers["location"])
                downgraded |= downgrade
                continue
            return resp
        raise IOFailure(f"registry {self.ref.host}: too many redirects")

    def _redirect(self, url: str, location: str) -> tuple[str, bool]:
        """Where a redirect leads, if slm may go there, and whether it is a downgrade (HTTPS to
        plain HTTP): plain HTTP only with --insecure or to a loopback host, and a downgrade only
        with --insecure."""
        target = join(url, location, self.ref.host)
        there = origin_of(target, self.ref.host)
        downgrade = origin_of(url, self.ref.host).scheme == "https" and there.scheme == "http"
        if there.scheme == "http" and not self.insecure:
            if downgrade:
                raise IOFailure(f"registry {self.ref.host}: redirected from HTTPS to plain HTTP ({there}); refused "
                                "(--insecure follows it, without credentials)")
            if not there.is_loopback:
                raise IOFailure(f"registry {self.ref.host}: redirected to plain HTTP ({there}); refused "
                                "(--insecure follows it, without credentials)")
        return target, downgrade

    def _answer(self, challenge: str, clock: Clock) -> bool:
        """Set the Authorization header for a challenge; False if there is nothing to answer with.
        A Bearer realm on another origin receives the Basic credentials (the distribution token
        flow), over HTTPS only."""
        scheme = challenge.split(" ", 1)[0].lower()
        params = dict(_CHALLENGE.findall(challenge))
        if scheme == "basic":
            if self.credentials is None:
                return False
            self._auth_header = self.credentials.basic()
            return True
        if scheme != "bearer" or "realm" not in params:
            return False
        query = {k: v for k, v in params.items() if k in ("service", "scope")}
        url = params["realm"] + ("?" + urllib.parse.urlencode(query) if query else "")
        realm = origin_of(url, self.ref.host)
        if realm != self.origin and realm.scheme != "https":
            raise IOFailure(f"registry {self.ref.host}: its token realm {realm} is plain HTTP on another "
                            "origin; refused (credentials go there over HTTPS only)")
        headers = {"Authorization": self.credentials.basic()} if self.credentials else {}
        resp = self.transport.send("GET", url, None, headers, 1 << 20, clock)
        if resp.status != 200:
            raise IOFailure(f"registry {self.ref.host}: the token service refused ({resp.status}); "
                            f"check {ENV_AUTH} or ~/.docker/config.json")
        try:
            doc = json.loads(resp.body)
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise IOFailure(f"registry {self.ref.host}: the token service sent no token")
        self._auth_header = f"Bearer {token}"
        return True

    def _fail(self, resp: Response, what: str) -> IOFailure | NotFound:
        code = ""
        try:
            errors = json.loads(resp.body).get("errors") or []
            code = f" ({shown(errors[0].get('code'), 60)}: {shown(errors[0].get('message'))})" if errors else ""
        except (ValueError, AttributeError, IndexError, TypeError):
            pass
        if resp.status == 404:
            return NotFound(f"registry {self.ref.host}: {what}: not found{code}")
        if resp.status in (401, 403):
            return IOFailure(f"registry {self.ref.host}: {what}: access denied ({resp.status}){code}; "
                             f"set {ENV_AUTH} or log in (~/.docker/config.json)")
        return IOFailure(f"registry {self.ref.host}: {what}: HTTP {resp.status}{code}")

    def _url(self, kind: str, ref: str) -> str:
        return f"{self.base}/v2/{self.ref.repository}/{kind}/{ref}"

    # -- blobs ------------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        resp = self.request("HEAD", self._url("blobs", digest), limit=0)
        if resp.status == 200:
            return True
        if resp.status == 404:
            return False
        raise self._fail(resp, f"HEAD blob {digest[:19]}")

    def upload_blob(self, digest: str, data: bytes | memoryview) -> None:
        resp = self.request("POST", self._url("blobs", "uploads/"), body=b"",
                            headers={"Content-Length": "0"})
        if resp.status != 202 or "location" not in resp.headers:
            raise self._fail(resp, "start an upload")
        location, _ = self._redirect(self.base + "/", resp.headers["location"])  # held to the same rules
        view = memoryview(data)
        if len(view) > CHUNK:
            for start in range(0, len(view), CHUNK):
                part = view[start:start + CHUNK]
                resp = self.request("PATCH", location, body=bytes(part), headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Range": f"{start}-{start + len(part) - 1}", "Content-Length": str(len(part))})
                if resp.status != 202 or "location" not in resp.headers:
                    raise self._fail(resp, f"upload chunk of {digest[:19]}")
                location, _ = self._redirect(self.base + "/", resp.headers["location"])
            view = memoryview(b"")
        sep = "&" if "?" in location else "?"
        resp = self.request("PUT", f"{location}{sep}digest={urllib.parse.quote(digest)}", body=bytes(view),
                            headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(view))})
        if resp.status != 201:
            raise self._fail(resp, f"upload blob {digest[:19]}")

    def upload_stream(self, digest: str, size: int, chunks) -> None:
        """Upload a blob too big to hold whole (a GGUF rebuilt from the store) from an iterator
        of its bytes: PATCHed in pieces of at most CHUNK as they come, then the digest PUT; at
        most CHUNK bytes held. The registry checks the digest; `size` must be the bytes' count."""
        resp = self.request("POST", self._url("blobs", "uploads/"), body=b"", headers={"Content-Length": "0"})
        if resp.status != 202 or "location" not in resp.headers:
            raise self._fail(resp, "start an upload")
        location, _ = self._redirect(self.base + "/", resp.headers["location"])
        start, held = 0, bytearray()

        def send(part: bytes) -> str:
            resp = self.request("PATCH", location, body=part, headers={
                "Content-Type": "application/octet-stream",
                "Content-Range": f"{start}-{start + len(part) - 1}", "Content-Length": str(len(part))})
            if resp.status != 202 or "location" not in resp.headers:
                raise self._fail(resp, f"upload chunk of {digest[:19]}")
            return self._redirect(self.base + "/", resp.headers["location"])[0]

        for chunk in chunks:
            held += chunk
            while len(held) >= CHUNK:
                location = send(bytes(held[:CHUNK]))
                start += CHUNK
                del held[:CHUNK]
        if held:
            location = send(bytes(held))
            start += len(held)
        if start != size:
            raise IntegrityError(f"blob {digest[:19]}: {start} bytes to upload, expected {size}")
        sep = "&" if "?" in location else "?"
        resp = self.request("PUT", f"{location}{sep}digest={urllib.parse.quote(digest)}", body=b"",
                            headers={"Content-Type": "application/octet-stream", "Content-Length": "0"})
        if resp.status != 201:
            raise self._fail(resp, f"upload blob {digest[:19]}")

    def get_blob(self, digest: str, size: int) -> bytes:
        """At most `size` bytes (more is refused); the caller verifies the digests."""
        resp = self.request("GET", self._url("blobs", digest), limit=size)
        if resp.status != 200:
            raise self._fail(resp, f"blob {digest[:19]}")
        return resp.body

    def blob_chunks(self, digest: str, size: int) -> Iterator[bytes]:
        """A blob's bytes as they arrive, in pieces, at most `size` + 1 of them in all (the caller
        refuses a longer blob at its first extra byte, and verifies the digests); nothing is held
        whole. The request is made at the first `next`; close the iterator when done with it."""
        resp = self.request("GET", self._url("blobs", digest), limit=size, stream=True)
        if resp.stream is None:
            raise self._fail(resp, f"blob {digest[:19]}")
        with contextlib.closing(resp.stream) as body:
            yield from body.chunks()

    # -- manifests -----------------------------------------------------------------------------
    def put_manifest(self, ref: str, data: bytes, media_type: str = mt.OCI_MANIFEST) -> Response:
        resp = self.request("PUT", self._url("manifests", ref), body=data,
                            headers={"Content-Type": media_type, "Content-Length": str(len(data))})
        if resp.status != 201:
            raise self._fail(resp, f"put manifest {ref}")
        return resp

    def get_referrers(self, digest: str) -> bytes | None:
        """The OCI 1.1 referrers index of a manifest (an image index), None where the registry
        has no referrers API (404: distribution 2.8; the caller reads the fallback tag)."""
        resp = self.request("GET", self._url("referrers", digest), headers={"Accept": mt.OCI_INDEX},
                            limit=MAX_MANIFEST_BYTES)
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise self._fail(resp, f"referrers of {digest[:19]}")
        return resp.body

    def get_manifest(self, ref: str, media_type: str = mt.OCI_MANIFEST) -> bytes | None:
        """The manifest bytes (None if the registry has none under `ref`); a digest reference is
        checked against the bytes."""
        resp = self.request("GET", self._url("manifests", ref), headers={"Accept": media_type},
                            limit=MAX_MANIFEST_BYTES)
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise self._fail(resp, f"manifest {ref}")
        got = resp.headers.get("content-type", "").split(";")[0].strip()
        if got != media_type:
            raise InvalidInput(f"registry {self.ref.host}: {ref} is a {shown(got, 80) or 'untyped'} manifest, "
                               f"not {media_type}")
        if ref.startswith("sha256:") and sha256_of(resp.body) != ref:
            raise IntegrityError(f"registry {self.ref.host}: manifest {ref[:19]} does not hash to its digest")
        return resp.body
