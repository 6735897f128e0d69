"""The verdict on a received blob's bytes (slm.ops.ship.receive, slm.ops.ship.model_pull):
its size, sha256 and (for a layer) BLAKE3 against what its descriptor and annotation give,
whole or streamed, and a copy refused at its first byte past the declared size."""

from __future__ import annotations

import hashlib

from slm.distribution.bundle import SHA256, Descriptor, Layer, sha256_of
from slm.errors import IntegrityError
from slm.ops.progress import Progress
from slm.store import digest as dg


def check_received(where: str, digest: str, size: int, blake3: str | None, got_size: int,
                    got_sha256: str, got_blake3: str | None) -> None:
    """The one verdict on a received blob's bytes (whole or streamed): exit 5 unless its size,
    sha256 and (for a layer) BLAKE3 are those its descriptor and annotation give."""
    if got_size != size:
        raise IntegrityError(f"{where}: blob {digest[:19]} is {got_size} bytes, its descriptor says {size}")
    if got_sha256 != digest:
        raise IntegrityError(f"{where}: blob {digest[:19]} does not hash to its sha256 digest (tampered or damaged)")
    if blake3 is not None and got_blake3 != blake3:
        raise IntegrityError(f"{where}: blob {digest[:19]} does not hash to the BLAKE3 digest its annotation "
                             f"claims ({dg.short(blake3)})")


def checked(data: bytes, layer: Layer | Descriptor, blake3: str | None, where: str) -> bytes:
    digest = layer.sha256 if isinstance(layer, Layer) else layer.digest
    check_received(where, digest, layer.size, blake3, len(data), sha256_of(data),
                    dg.of_bytes(data) if blake3 is not None else None)
    return data


class Hashed:
    """Where a kept blob's bytes go while they are re-hashed: BLAKE3 of them, and the bytes
    themselves if `hold` (a small blob the receiver parses)."""

    def __init__(self, hold: bool):
        self._hasher = dg.hasher()
        self.held: list[bytes] | None = [] if hold else None

    def write(self, chunk: bytes) -> None:
        self._hasher.update(chunk)
        if self.held is not None:
            self.held.append(chunk)

    @property
    def digest(self) -> str:
        return dg.PREFIX + self._hasher.hexdigest()


def copy_bounded(chunks, out, size: int, digest: str, where: str, progress: Progress) -> tuple[int, str]:
    """Copy a blob's chunks to `out` as they arrive, refused at the first byte past the `size`
    its descriptor gives (a longer body never lands whole): (bytes copied, "sha256:<hex>")."""
    n, sha = 0, hashlib.sha256()
    for chunk in chunks:
        n += len(chunk)
        if n > size:
            raise IntegrityError(f"{where}: blob {digest[:19]} is longer than the {size} bytes its descriptor says")
        sha.update(chunk)
        out.write(chunk)
        progress.advance(len(chunk))
    return n, SHA256 + sha.hexdigest()
