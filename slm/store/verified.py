"""The verified-digest cache: blob files that were re-hashed and matched their names, each with
what the file system said about the file then, so that an activation need not re-read and
re-hash a 98 MB base that has not changed since.

    cache/verified-digests    slm-verified-digests 1
                              <64 hex> <st_dev> <st_ino> <st_size> <st_mtime_ns> <st_ctime_ns>
                              ...
                              blake3:<64 hex: the digest of every byte above this line>

What it trusts: that a blob file whose (device, inode, size, mtime, ctime) are what they were
when its bytes were last hashed and matched its name still holds those bytes. A write to a
file moves its mtime and ctime; putting the mtime back (os.utime) moves the ctime again, which
only the kernel sets; a file replaced by another (a rename, a copy back) has another inode. Not
caught: bytes that change on the medium with no write (bit rot), and a writer who can also set
the clock back or edit the block device or this file itself (who can write the store can write
its blobs too). `slm verify` and `slm fsck` re-hash every byte whatever this file says, and
refresh it (`fsck` drops what it did not verify).

Advisory: a missing, torn, oversized or corrupt file (or anything but a regular file in its
place) means "re-hash", never an error. It is derived data, not store state: rewritten whole
in place without fsync (fs.write_advisory: a power cut may lose or tear it, the checksum says
so), and a command that fails may still have refreshed it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from slm.errors import SlmError
from slm.store import digest as dg
from slm.store import fs

FILE_NAME = "verified-digests"
HEADER = b"slm-verified-digests 1\n"
MAX_BYTES = 64 << 20  # about 500,000 blobs
# A file changed within one clock tick of its last change may keep its ctime (the kernel's
# file times are coarse: a tick is at most 10 ms): a file is recorded only if its ctime is
# older than this before its hash began, so a later write cannot leave the same key.
RACY_NS = 100_000_000

Key = tuple[int, int, int, int, int]


def key_of(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def spell(key: Key) -> str:
    """A key as a record line spells it. Records are kept spelt: a store holds a record per
    blob (1,500 with three LoRAs) and an activation asks about its own few hundred, so a key is
    spelt when asked rather than every record parsed into numbers when loaded."""
    return f"{key[0]} {key[1]} {key[2]} {key[3]} {key[4]}"


class VerifiedCache:
    """The records of one store, loaded on first use and saved by `save` when they changed.

    Thread-safe: an activation hashes its base on a pool beside its adapters."""

    def __init__(self, path: Path):
        self.path = path
        self._records: dict[str, str] | None = None  # hex digest -> spell(key)
        self._dirty = False
        self._lock = threading.Lock()

    def _loaded(self) -> dict[str, str]:
        if self._records is None:
            self._records = _parse(_read(self.path))
        return self._records

    def trusts(self, digest: str, st: os.stat_result) -> bool:
        """Whether the blob of `digest`, a file now described by `st`, was verified as it is."""
        with self._lock:
            return self._loaded().get(dg.hex_of(digest)) == spell(key_of(st))

    def record(self, digest: str, before: os.stat_result, after: os.stat_result, started_ns: int) -> None:
        """The bytes of `digest`'s file hashed to `digest`, from `before` (the file when it was
        opened) to `after` (when the hash ended), a hash begun at time.time_ns() `started_ns`.
        A file that changed meanwhile, or changed too recently to be told apart, is not recorded."""
        key = key_of(after)
        if key_of(before) != key or after.st_ctime_ns > started_ns - RACY_NS:
            return
        with self._lock:
            records = self._loaded()
            if records.get(dg.hex_of(digest)) != spell(key):
                records[dg.hex_of(digest)] = spell(key)
                self._dirty = True

    def record_written(self, digest: str, st: os.stat_result, pinned_mtime_ns: int) -> None:
        """A blob file this process wrote itself from bytes that hashed to `digest`, its mtime
        then pinned to `pinned_mtime_ns` (fs.pin_mtime, a time already past), now described by
        `st`. Recorded at once, with no racy window: a later write sets the mtime to the present,
        never to the pinned time, so it changes the key whatever the clock's tick."""
        if st.st_mtime_ns != pinned_mtime_ns:
            return  # the pin did not hold (or something wrote since): the next reader re-hashes
        with self._lock:
            records = self._loaded()
            spelt = spell(key_of(st))
            if records.get(dg.hex_of(digest)) != spelt:
                records[dg.hex_of(digest)] = spelt
                self._dirty = True

    def forget(self, digest: str) -> None:
        """A blob that did not hash to its name (or is gone): no record may vouch for it."""
        with self._lock:
            if self._loaded().pop(dg.hex_of(digest), None) is not None:
                self._dirty = True

    def retain(self, digests: set[str]) -> None:
        """Keep only the records of `digests` (what fsck has just verified)."""
        keep = {dg.hex_of(d) for d in digests}
        with self._lock:
            records = self._loaded()
            for hex_digest in [h for h in records if h not in keep]:
                del records[hex_digest]
                self._dirty = True

    def save(self) -> None:
        """Write the records if they changed; a failed write is ignored (the next command
        re-hashes what it cannot find)."""
        with self._lock:
            if not self._dirty or self._records is None:
                return
            data = _serialize(self._records)
            self._dirty = False
        try:
            fs.write_advisory(self.path, data)
        except SlmError:
            pass


def _read(path: Path) -> bytes:
    try:
        return fs.read_store_file(path, MAX_BYTES) or b""
    except SlmError:  # a FIFO, a directory, a link or an oversized file in its place
        return b""


def _serialize(records: dict[str, str]) -> bytes:
    body = HEADER + "".join(f"{h} {k}\n" for h, k in sorted(records.items())).encode("ascii")
    return body + dg.of_bytes(body).encode("ascii") + b"\n"


def _parse(data: bytes) -> dict[str, str]:
    """The records of an intact file (hex digest -> spelt key); {} for anything else (absent,
    torn, edited, garbage: the checksum says). The lines are not parsed further: a record is
    only ever compared with a key spelt by `spell`, so one that no key spells (a hand-made
    file with a valid checksum) vouches for nothing, and every activation, which reads a
    record per blob of the store, is spared checking each line."""
    body, sep, trailer = data[:-1].rpartition(b"\n")
    body += sep
    if not data.endswith(b"\n") or not body.startswith(HEADER):
        return {}
    try:
        if trailer.decode("ascii") != dg.of_bytes(body):
            return {}
        return dict(line.split(" ", 1) for line in body[len(HEADER):].decode("ascii").split("\n")[:-1])
    except (UnicodeDecodeError, ValueError):  # a line with no space: not a record
        return {}
