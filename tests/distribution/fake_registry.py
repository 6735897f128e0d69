"""A fake OCI registry on loopback that serves one exported bundle and can be told to misbehave;
it records every request it receives (scheme, method, path, Authorization, client address).

With `tls`, the same port speaks HTTPS and plain HTTP (the first byte of a connection decides),
so a redirect to `http://` the same host:port is a scheme downgrade and nothing else, as an
HTTPS registry on port 443 redirecting to port 80 of the same host.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import socket
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class Seen:
    scheme: str
    method: str
    path: str
    authorization: str
    client: tuple


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def blobs_redirected_to(storage: "FakeRegistry"):
    """A `misbehave` hook: every blob GET that carries credentials is answered with a 307 to the
    same path on `storage` (another origin), as registries backed by object storage do."""
    def to_storage(handler) -> bool:
        if "/blobs/" in handler.path and handler.headers.get("Authorization"):
            handler.reply(307, headers=[("Location", f"http://{storage.host}{handler.path}")])
            return True
        return False
    return to_storage


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A CA-flagged self-signed certificate for 127.0.0.1 (clients trust it via SSL_CERT_FILE)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "slm-test-registry")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def read_layout(layout: Path) -> tuple[bytes, dict[str, bytes]]:
    """(manifest bytes, {sha256 digest: blob}) of an exported OCI layout directory."""
    index = json.loads((layout / "index.json").read_bytes())
    blobs = {f"sha256:{p.name}": p.read_bytes() for p in (layout / "blobs" / "sha256").iterdir()}
    return blobs[index["manifests"][0]["digest"]], blobs


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept-alive connections, as a real registry's
    server: FakeRegistry

    def log_message(self, *args):
        pass

    @property
    def scheme(self) -> str:
        return "https" if isinstance(self.connection, ssl.SSLSocket) else "http"

    def reply(self, code: int, body: bytes = b"", headers=()) -> None:
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def raw(self, data: bytes, close: bool = True) -> None:
        """Bytes on the wire as they are (a broken response); `close` ends the connection."""
        self.wfile.write(data)
        self.wfile.flush()
        self.close_connection = close

    def _handle(self) -> None:
        auth = self.headers.get("Authorization", "")
        self.server.seen.append(Seen(self.scheme, self.command, self.path, auth, self.client_address))
        if self.server.misbehave is not None and self.server.misbehave(self):
            return
        if self.server.password is not None and auth != self.server.password:
            return self.reply(401, headers=[("WWW-Authenticate", 'Basic realm="fake"')])
        parts = self.path.split("?")[0].split("/")
        if len(parts) >= 5 and parts[-2] == "manifests":
            return self.reply(200, self.server.manifest, [("Content-Type", OCI_MANIFEST)])
        if len(parts) >= 5 and parts[-2] == "blobs" and parts[-1] in self.server.blobs:
            return self.reply(200, self.server.blobs[parts[-1]], [("Content-Type", "application/octet-stream")])
        self.reply(404, b'{"errors":[{"code":"NOT_FOUND","message":"not here"}]}')

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _handle


class FakeRegistry(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, manifest: bytes = b"{}", blobs: dict[str, bytes] | None = None,
                 misbehave: Callable[[_Handler], bool] | None = None, password: str | None = None,
                 tls: tuple[Path, Path] | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.manifest, self.blobs = manifest, blobs or {}
        self.misbehave = misbehave  # returns True when it answered the request itself
        self.password = password  # the Authorization header required, if any
        self.seen: list[Seen] = []
        self.stopping = threading.Event()
        self.tls = None
        if tls is not None:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.load_cert_chain(*map(str, tls))

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_port}"

    def get_request(self):
        sock, addr = self.socket.accept()
        if self.tls is not None:
            sock.settimeout(10)
            try:
                first = sock.recv(1, socket.MSG_PEEK)
            except OSError:
                first = b""
            if first == b"\x16":  # a TLS ClientHello: the HTTPS side of this port
                sock = self.tls.wrap_socket(sock, server_side=True)
            sock.settimeout(None)
        return sock, addr

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.shutdown()
        self.server_close()
