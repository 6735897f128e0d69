"""BLAKE3 digests, written `blake3:<64 hex>` (a registered OCI digest algorithm)."""

from __future__ import annotations

import re
from typing import Iterable

import blake3

from slm.errors import InvalidInput

PREFIX = "blake3:"
_DIGEST = re.compile(PREFIX + r"[0-9a-f]{64}")
# Threads pay off only on large inputs; below this a single thread is faster.
_THREADED_FROM = 1 << 22


def hasher() -> "blake3.blake3":
    return blake3.blake3(max_threads=blake3.blake3.AUTO)


def of_bytes(data: bytes | memoryview) -> str:
    threads = blake3.blake3.AUTO if len(data) >= _THREADED_FROM else 1
    return PREFIX + blake3.blake3(data, max_threads=threads).hexdigest()


def of_chunks(chunks: Iterable[bytes | memoryview]) -> str:
    h = hasher()
    for chunk in chunks:
        h.update(chunk)
    return PREFIX + h.hexdigest()


def is_digest(text: str) -> bool:
    # one match, no slice: an activation asks this several times for each of its ~700 blobs
    return isinstance(text, str) and _DIGEST.fullmatch(text) is not None


def hex_of(digest: str) -> str:
    """The 64 hex characters of a well-formed digest; InvalidInput otherwise (stored digests
    are checked where their file is parsed, so a malformed one here came from outside)."""
    if not is_digest(digest):
        raise InvalidInput(f"not a blake3 digest: {digest!r}")
    return digest[len(PREFIX):]


def short(digest: str, n: int = 12) -> str:
    return digest[len(PREFIX):len(PREFIX) + n] if is_digest(digest) else digest


def short_pair(a: str, b: str, n: int = 12) -> tuple[str, str]:
    """Two digests for a message that sets them side by side ("names X, not Y"): as short as
    `short`, but when they share their first n digits, long enough to show where they differ
    (four digits past the common prefix), so the two never print as the same text."""
    if not (is_digest(a) and is_digest(b)) or a == b:
        return short(a, n), short(b, n)
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) - len(PREFIX)
    width = max(n, min(common + 4, len(a) - len(PREFIX)))
    return short(a, width), short(b, width)
