"""HTTP for the registry client: every request under one clock, URLs read as origins, one error path.

The clock (`Clock`): a network operation (one registry request with its redirects, its auth
challenge and its token fetch) may take `timeout_s` plus one second per `min_rate` bytes moved
(sent or received), and no single wait on the socket may exceed `timeout_s`. So a registry
that stops answering, or sends a byte now and then, is cut off; a transfer that keeps at least
`min_rate` after its first `timeout_s` seconds never is. The socket under http.client is
wrapped so that every connect, read and write is held to it, the status line and headers
included (the TLS handshake gets one socket timeout, which CPython applies to the handshake
as a whole).

The error path (`Transport.send`): whatever the server does (a garbage status line, too many
or too long headers, bad chunked encoding, a body shorter than its Content-Length, a URL that
does not parse), the request fails with one IOFailure whose message quotes the server's text
escaped and cut short, and the connection is dropped: nothing is read from it again.

A body too big to hold (a blob) is read as it arrives (`send(..., stream=True)` gives a 200
response's body as a `Body`): the same clock and the same error path for every piece, at most
`limit` + 1 bytes read, the connection the body's until it is closed.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import math
import os
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Iterator

from slm.distribution.reference import is_loopback_host
from slm.errors import IntegrityError, InvalidInput, IOFailure, printable

ENV_TIMEOUT = "SLM_REGISTRY_TIMEOUT_S"
ENV_MIN_RATE = "SLM_REGISTRY_MIN_RATE"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MIN_RATE = 16384.0  # bytes a second: a slow link passes, a trickle does not
SEND_PIECE = 1 << 14  # an upload is written in pieces (one TLS record each), each under the clock
READ_PIECE = 1 << 20
ERROR_BODY_LIMIT = 1 << 20  # the body of a response that is not the streamed blob (an error, a redirect)


def shown(text: object, limit: int = 120) -> str:
    """Server-provided text as it may appear in a message: one line, escaped, cut short."""
    flat = printable(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _setting(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InvalidInput(f"{name} must be a positive number (got {shown(raw, 40)})")
    return value


@dataclass(frozen=True)
class Limits:
    timeout_s: float = DEFAULT_TIMEOUT_S
    min_rate: float = DEFAULT_MIN_RATE

    @classmethod
    def from_env(cls) -> Limits:
        return cls(_setting(ENV_TIMEOUT, DEFAULT_TIMEOUT_S), _setting(ENV_MIN_RATE, DEFAULT_MIN_RATE))


class Overdue(Exception):
    """The clock ran out (turned into an IOFailure by Transport.send)."""


class Clock:
    """One network operation's allowance: timeout_s, plus 1/min_rate seconds per byte moved."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.start = time.monotonic()
        self.moved = 0

    def wait_allowed(self, extra_bytes: int = 0) -> float:
        """How long the next socket wait may last (moving `extra_bytes` more); Overdue if none."""
        due = self.start + self.limits.timeout_s + (self.moved + extra_bytes) / self.limits.min_rate
        left = due - time.monotonic()
        if left <= 0:
            raise Overdue()
        return min(left, self.limits.timeout_s)


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str  # lower case, IPv6 without brackets
    port: int

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.netloc}"


def origin_of(url: str, who: str) -> Origin:
    """The origin (scheme, host, port) of a URL a registry gave; IOFailure if it is not an
    http(s) URL slm can follow (`who` names the registry in the message)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise IOFailure(f"registry {who}: sent a malformed URL ({shown(url)})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise IOFailure(f"registry {who}: sent a URL slm does not follow ({shown(url)})")
    if parts.username is not None or parts.password is not None:  # never echo or use them
        raise IOFailure(f"registry {who}: sent a URL with credentials in it; refused")
    return Origin(parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80))


def join(base: str, location: str, who: str) -> str:
    try:
        return urllib.parse.urljoin(base, location)
    except ValueError:
        raise IOFailure(f"registry {who}: sent a malformed URL ({shown(location)})") from None


class _PacedReader(io.RawIOBase):
    """The socket's own reader (which keeps the socket open while a response still reads from
    it, as http.client expects), each read held to the clock."""

    def __init__(self, conn: _Paced):
        self.conn = conn
        self.inner = conn.raw_sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        clock = self.conn.clock
        self.conn.raw_sock.settimeout(clock.wait_allowed())
        try:
            n = self.inner.readinto(buffer)
        except TimeoutError:
            raise Overdue() from None
        clock.moved += n or 0
        return n

    def close(self) -> None:
        self.inner.close()
        super().close()


class _PacedSocket:
    """The socket as http.client sees it: reads and writes held to the connection's clock."""

    def __init__(self, conn: _Paced):
        self.conn = conn

    def makefile(self, mode: str, *args, **kwargs):
        return io.BufferedReader(_PacedReader(self.conn), READ_PIECE)

    def sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        clock, sock = self.conn.clock, self.conn.raw_sock
        for start in range(0, len(view), SEND_PIECE):
            piece = view[start:start + SEND_PIECE]
            sock.settimeout(clock.wait_allowed(len(piece)))
            try:
                sock.sendall(piece)
            except TimeoutError:
                raise Overdue() from None
            clock.moved += len(piece)

    def close(self) -> None:
        self.conn.raw_sock.close()

    def __getattr__(self, name):
        return getattr(self.conn.raw_sock, name)


class _Paced:
    """Mixed into http.client's connections: connect (and the TLS handshake) within the clock,
    then every read and write through _PacedSocket."""

    clock: Clock
    raw_sock: socket.socket

    def connect(self) -> None:
        self.timeout = self.clock.wait_allowed()  # a connect that times out: "cannot reach"
        super().connect()
        self.raw_sock = self.sock
        self.sock = _PacedSocket(self)


class _PacedHTTP(_Paced, http.client.HTTPConnection):
    pass


class _PacedHTTPS(_Paced, http.client.HTTPSConnection):
    pass


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes
    stream: Body | None = None  # a 200 response's body not yet read (send(..., stream=True))


class Body:
    """A response body read piece by piece as it arrives, under its request's clock and error
    path. The connection is the body's until `close`: kept for the next request if the body
    was read to its end, dropped otherwise (the rest of it would be read as the next response)."""

    def __init__(self, transport: Transport, origin: Origin, method: str, resp: http.client.HTTPResponse,
                 clock: Clock, limit: int):
        self.transport, self.origin, self.method = transport, origin, method
        self.resp, self.clock, self.limit = resp, clock, limit
        self._ended = False

    def chunks(self) -> Iterator[bytes]:
        """The bytes, at most READ_PIECE at a time and `limit` + 1 in all (one more than the caller
        accepts, so that a longer body is seen, not read to its end). A body that stops short of
        its Content-Length fails as a broken response (IOFailure), as a whole one does."""
        left = self.limit + 1
        while left > 0 and not self._ended:
            with self.transport.failures(self.origin, self.method, self.clock):
                piece = self.resp.read(min(READ_PIECE, left))
                if not piece and self.resp.length:
                    raise http.client.IncompleteRead(b"", self.resp.length)
            if not piece:
                self._ended = True
                return
            left -= len(piece)
            yield piece

    def close(self) -> None:
        if self._ended and self.resp.isclosed():
            self.transport._used.add(self.origin)
        else:
            self.transport._drop(self.origin)


def _read_body(resp: http.client.HTTPResponse, limit: int | None) -> bytes:
    """The whole body, or IntegrityError past `limit`; IncompleteRead when it stops short of
    its Content-Length (http.client's read(amt) would return the short bytes)."""
    parts, got = [], 0
    while True:
        want = READ_PIECE if limit is None else min(READ_PIECE, limit + 1 - got)
        piece = resp.read(want)
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
        if limit is not None and got > limit:
            raise IntegrityError(f"response is larger than expected ({limit} bytes)")
    if resp.length:  # Content-Length promised more than the server sent
        raise http.client.IncompleteRead(b"".join(parts), resp.length)
    return b"".join(parts)


# What a misbehaving server (or URL) makes http.client raise: HTTPException covers a bad status
# line, a line over 64 KiB, over 100 headers, a short body, a URL with control characters;
# ValueError a bad chunk size or a header that does not encode.
_PROTOCOL = (http.client.HTTPException, ValueError)
_LOST = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class Transport:
    """Kept-alive connections, one per origin, for one thread."""

    def __init__(self, who: str, limits: Limits | None = None):
        self.who = who  # the registry, as messages name it
        self.limits = limits or Limits.from_env()
        self._conns: dict[Origin, http.client.HTTPConnection] = {}
        self._used: set[Origin] = set()

    def clock(self) -> Clock:
        return Clock(self.limits)

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        self._used.clear()

    def _drop(self, origin: Origin) -> None:
        conn = self._conns.pop(origin, None)
        self._used.discard(origin)
        if conn is not None:
            conn.close()

    def _conn(self, origin: Origin) -> http.client.HTTPConnection:
        if origin not in self._conns:
            if origin.scheme == "https":
                self._conns[origin] = _PacedHTTPS(origin.host, origin.port, context=ssl.create_default_context())
            else:
                self._conns[origin] = _PacedHTTP(origin.host, origin.port)
        return self._conns[origin]

    @contextlib.contextmanager
    def failures(self, origin: Origin, method: str, clock: Clock):
        """The one error path: whatever goes wrong on the wire (or the clock running out) drops the
        connection and becomes one IOFailure (IntegrityError for a body over its limit)."""
        try:
            yield
        except _LOST as err:
            self._drop(origin)
            raise IOFailure(f"registry {origin.netloc}: connection lost ({shown(err)})") from err
        except Overdue:
            self._drop(origin)
            raise IOFailure(
                f"registry {origin.netloc}: {method} too slow: {clock.moved} bytes moved in "
                f"{time.monotonic() - clock.start:.0f} s (allowed: {self.limits.timeout_s:g} s plus one "
                f"second per {self.limits.min_rate:g} bytes; {ENV_TIMEOUT}, {ENV_MIN_RATE})") from None
        except IntegrityError as err:
            self._drop(origin)
            raise IntegrityError(f"registry {origin.netloc}: {method} {err.message}") from None
        except ssl.SSLError as err:  # before _PROTOCOL: a certificate error is also a ValueError
            self._drop(origin)
            raise IOFailure(f"registry {origin.netloc}: TLS failed ({shown(err.reason or err)}); "
                            "plain HTTP is only used for loopback hosts or with --insecure") from None
        except _PROTOCOL as err:
            self._drop(origin)
            raise IOFailure(f"registry {origin.netloc}: broken HTTP response to {method} "
                            f"({type(err).__name__}: {shown(err)})") from None
        except OSError as err:
            self._drop(origin)
            raise IOFailure(f"cannot reach registry {origin.netloc}: {shown(err.strerror or err)}") from None
        except BaseException:  # anything else (Ctrl-C included): the connection's state is unknown
            self._drop(origin)
            raise

    def send(self, method: str, url: str, body: bytes | None, headers: dict[str, str],
             limit: int | None, clock: Clock, stream: bool = False) -> Response:
        """One request and its response, the body read whole (at most `limit` bytes), or with
        `stream` (and a `limit`) a 200 response's body left to read (`Response.stream`, at most
        `limit` + 1 bytes; any other response's body is read whole, at most ERROR_BODY_LIMIT)."""
        origin = origin_of(url, self.who)
        parts = urllib.parse.urlsplit(url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        for attempt in (1, 2):  # a kept-alive connection the server closed: reconnect once
            reused = origin in self._used
            conn = self._conn(origin)
            conn.clock = clock
            with self.failures(origin, method, clock):
                try:
                    conn.request(method, path, body=body, headers=headers)
                    resp = conn.getresponse()
                    headers_got = {k.lower(): v for k, v in resp.getheaders()}
                    if stream and resp.status == 200 and limit is not None:
                        return Response(resp.status, headers_got, b"", Body(self, origin, method, resp, clock, limit))
                    data = _read_body(resp, min(limit, ERROR_BODY_LIMIT) if stream and limit is not None else limit)
                except _LOST:
                    if attempt == 1 and reused:
                        self._drop(origin)
                        continue
                    raise
                self._used.add(origin)
                return Response(resp.status, headers_got, data)
        raise IOFailure(f"registry {origin.netloc}: connection lost")
