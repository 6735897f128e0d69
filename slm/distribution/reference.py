"""Registry references: `host[:port]/repo[/more][:tag|@sha256:<hex>]`.

The host part is required (slm has no default registry: a fleet names its own). Plain HTTP is
used only for a loopback host (127.0.0.0/8, ::1, localhost) or with --insecure; everything else
is HTTPS verified against the system trust store.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from slm.distribution.bundle import is_sha256
from slm.errors import InvalidInput

_REPO = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_HOST = re.compile(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?")


@dataclass(frozen=True)
class Reference:
    host: str  # host[:port] as typed (the key of ~/.docker/config.json "auths")
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def hostname(self) -> str:
        if self.host.startswith("["):
            return self.host[1:self.host.index("]")]
        return self.host.split(":")[0]

    @property
    def port(self) -> int | None:
        tail = self.host.rsplit("]", 1)[-1]
        return int(tail.rsplit(":", 1)[1]) if ":" in tail else None

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.hostname)

    @property
    def ref(self) -> str:
        """The tag or digest a manifest request names."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        return f"{self.host}/{self.repository}" + (f"@{self.digest}" if self.digest else f":{self.ref}")


def is_loopback_host(name: str) -> bool:
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def redacted(text: str) -> str:
    """A reference as a message may show it: whatever precedes an '@' that does not start a
    digest (a `user:password@` someone typed) is hidden, wherever the '/' fell."""
    cut = max((i for i, ch in enumerate(text) if ch == "@" and not text.startswith("sha256:", i + 1)),
              default=-1)
    return text if cut < 0 else "<hidden>" + text[cut:]


def parse_reference(text: str) -> Reference:
    if redacted(text) != text:
        raise InvalidInput(f"registry reference {redacted(text)!r}: '@' only introduces a digest "
                           "(@sha256:<hex>); credentials never go in a reference (SLM_REGISTRY_AUTH or "
                           "~/.docker/config.json)")
    host, sep, rest = text.partition("/")
    if not sep or not rest or not _HOST.fullmatch(host) or ("." not in host and ":" not in host
                                                             and host != "localhost"):
        raise InvalidInput(f"registry reference {text!r}: expected host[:port]/repository[:tag|@sha256:...] "
                           "(the host is required)")
    digest = tag = None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not is_sha256(digest):
            raise InvalidInput(f"registry reference {text!r}: digest must be sha256:<64 hex>")
    else:
        last = rest.rsplit("/", 1)[-1]
        if ":" in last:
            rest, tag = rest.rsplit(":", 1)
            if not _TAG.fullmatch(tag):
                raise InvalidInput(f"registry reference {text!r}: bad tag {tag!r}")
    if not _REPO.fullmatch(rest) or len(rest) > 255:
        raise InvalidInput(f"registry reference {text!r}: bad repository name {rest!r} "
                           "(lowercase letters, digits, '.', '_', '-', '/')")
    port = host.rsplit(":", 1)[1] if ":" in host.rsplit("]", 1)[-1] else None
    if port is not None and not 0 < int(port) < 65536:
        raise InvalidInput(f"registry reference {text!r}: bad port {port}")
    return Reference(host, rest, tag, digest)


def is_repository(text: str) -> bool:
    return len(text) <= 255 and _REPO.fullmatch(text) is not None


def is_tag(text: str) -> bool:
    return _TAG.fullmatch(text) is not None


def parse_target(text: str) -> tuple[str, str]:
    """(repository, tag) of `slm sign --for REPO:TAG`. A leading registry host (a first
    component with a '.' or a ':', or `localhost`: Docker's rule) is accepted and dropped: a
    statement names the repository and tag, so it holds on every mirror of the registry."""
    head, sep, _ = text.partition("/")
    has_host = sep and ("." in head or ":" in head or head == "localhost")
    try:
        ref = parse_reference(text if has_host else "localhost/" + text)
    except InvalidInput:
        ref = None
    if ref is None or ref.tag is None:
        raise InvalidInput(f"--for {text[:300]!r}: expected REPO:TAG (a repository of lowercase letters, digits, "
                           "'.', '_', '-', '/'; a tag of letters, digits, '_', '.', '-')")
    return ref.repository, ref.tag
