"""Content-addressed blobs: objects/blake3/<64 hex>, read-only once written.

Writes go through a `Staging` area under tmp/: blobs are streamed there while hashing and
fsynced, and only `commit()` moves them into objects/ (hard link, first writer wins, fsync the
directory, chmod 0444). An import that fails before commit leaves objects/ untouched; one that
crashes during commit leaves at most unreferenced blobs, which `slm gc` removes.

Existence is never proof: `verify` and `hash_file` re-hash the bytes; `read_verified` and
`first_bad` re-hash them unless the verified-digest cache (slm.store.verified) vouches for the
file as it is, and every hash that matches refreshes that cache.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from slm.errors import Busy, IntegrityError, IOFailure, NotFound, SlmError
from slm.store import digest as dg
from slm.store import fs
from slm.store.lock import held_elsewhere
from slm.store.sync_pool import Syncs
from slm.store.verified import VerifiedCache, key_of

BLOB_MODE = 0o444
_CHUNK = 1 << 20


class ObjectStore:
    def __init__(self, objects_dir: Path, tmp_dir: Path, verified: VerifiedCache | None = None):
        self.dir = objects_dir / "blake3"
        self.tmp_dir = tmp_dir
        self.verified = verified
        self._dir_text = str(self.dir)

    def path(self, digest: str) -> Path:
        return self.dir / dg.hex_of(digest)

    def _path_text(self, digest: str) -> str:
        """`path` as a string, for the checks made once per blob (building a pathlib path costs
        more than the stat it is for)."""
        return os.path.join(self._dir_text, digest[len(dg.PREFIX):])

    def has(self, digest: str) -> bool:
        """Whether a file of that name exists (not whether its bytes are right)."""
        if not dg.is_digest(digest):
            return False
        try:  # (an import asks once per tensor)
            return stat.S_ISREG(os.stat(self._path_text(digest)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def size(self, digest: str) -> int:
        return self._existing(digest).stat().st_size

    def _existing(self, digest: str) -> Path:
        if not dg.is_digest(digest):
            raise NotFound(f"not a blake3 digest: {digest!r}")
        path = self.path(digest)
        try:
            mode = os.lstat(path).st_mode  # one system call: activations check hundreds of blobs
        except (FileNotFoundError, NotADirectoryError):
            mode = 0
        if stat.S_ISLNK(mode):
            raise IntegrityError(f"blob {dg.short(digest)} is a symlink; the store refuses links")
        if not stat.S_ISREG(mode):
            raise NotFound(f"no blob {digest} in the store")
        return path

    def _open(self, digest: str) -> int:
        """A descriptor on a blob's file, opened as `_existing` checks it but in one system call
        (an activation reads hundreds of adapter blobs): a symlink is refused, a FIFO does not
        block; the caller checks that it is a regular file."""
        if not dg.is_digest(digest):
            raise NotFound(f"not a blake3 digest: {digest!r}")
        path = self._path_text(digest)
        try:
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no blob {digest} in the store") from None
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise IntegrityError(f"blob {dg.short(digest)} is a symlink; the store refuses links") from None
            raise IOFailure(f"cannot read blob {dg.short(digest)}: {os.strerror(err.errno)}") from err

    def hash_file(self, digest: str) -> str:
        """Re-hash the stored bytes of a blob (the digest they actually have). The verified-digest
        cache is never consulted here, only told what was found."""
        path = self._existing(digest)
        started = time.time_ns()
        h = dg.hasher()
        with open(path, "rb") as f:
            before = os.fstat(f.fileno())
            while chunk := f.read(_CHUNK * 8):
                h.update(chunk)
            after = os.fstat(f.fileno())
        found = dg.PREFIX + h.hexdigest()
        self._learn(digest, found == digest, before, after, started)
        return found

    def verify(self, digest: str) -> bool:
        """Whether the blob's bytes, re-hashed now, match its name (`slm verify`, `slm fsck`)."""
        return self.hash_file(digest) == digest

    def _learn(self, digest: str, matched: bool, before: os.stat_result, after: os.stat_result,
               started_ns: int) -> None:
        if self.verified is None:
            return
        if matched:
            self.verified.record(digest, before, after, started_ns)
        else:
            self.verified.forget(digest)

    def trusted(self, digest: str) -> bool:
        """Whether the verified-digest cache vouches for the blob's file as it is now."""
        if self.verified is None or not dg.is_digest(digest):
            return False
        try:
            info = os.lstat(self._path_text(digest))
        except OSError:
            return False
        return stat.S_ISREG(info.st_mode) and self.verified.trusts(digest, info)

    def save_verified(self) -> None:
        """Write what this process learnt into the verified-digest cache (advisory: never fails)."""
        if self.verified is not None:
            self.verified.save()

    def first_bad(self, digests: list[str], threads: int = 2) -> str | None:
        """The first of `digests` that is missing or does not hash to its name, or None.

        A blob the verified-digest cache vouches for is not read; the rest are hashed on
        `threads` threads (BLAKE3 releases the GIL): an activation checks the whole base,
        mostly files too small for BLAKE3's own threading."""
        from concurrent.futures import ThreadPoolExecutor

        unknown = [d for d in digests if not self.trusted(d)]
        if not unknown:
            return None

        def ok(digest: str) -> bool:
            return self.has(digest) and self.verify(digest)

        with ThreadPoolExecutor(max_workers=threads) as pool:
            for digest, good in zip(unknown, pool.map(ok, unknown)):
                if not good:
                    return digest
        return None

    def read_verified(self, digest: str) -> bytes:
        """A blob's bytes, checked to hash to its name (or vouched for by the verified-digest
        cache: the file is the one that did, unchanged)."""
        started = time.time_ns()
        fd = self._open(digest)
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                raise NotFound(f"no blob {digest} in the store")
            data = os.read(fd, before.st_size + 1)
            if len(data) != before.st_size:  # a short read, or a file that grew: on to the end
                chunks = [data]
                while chunk := os.read(fd, _CHUNK):
                    chunks.append(chunk)
                data = b"".join(chunks)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if (self.verified is not None and key_of(before) == key_of(after) and len(data) == after.st_size
                and self.verified.trusts(digest, after)):
            return data
        matched = dg.of_bytes(data) == digest
        self._learn(digest, matched, before, after, started)
        if not matched:
            raise IntegrityError(
                f"blob {dg.short(digest)} is corrupt: its bytes do not hash to its name "
                "(run `slm fsck`)"
            )
        return data

    def map(self, digest: str) -> memoryview:
        """A read-only memory map of a blob's bytes (no verification; see `verify`)."""
        path = self._existing(digest)
        size = path.stat().st_size
        if size == 0:
            return memoryview(b"")
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        return memoryview(mapped)

    def digests(self) -> Iterator[str]:
        if not self.dir.is_dir():
            return
        for entry in os.scandir(self.dir):
            name = entry.name
            candidate = dg.PREFIX + name
            if dg.is_digest(candidate):
                yield candidate

    def remove_new(self, digests: list[str]) -> None:
        """Unlink blobs that a failed transaction itself added (under the store lock nothing
        else can reference them yet) and fsync the directory."""
        for digest in digests:
            fs.unlink(self.path(digest))
        if digests:
            fs.fsync_dir(self.dir)

    def staging(self) -> "Staging":
        return Staging(self)


STAGING_LOCK = ".lock"
# a committed blob's mtime: this far in the past (more than any clock tick), so that a later
# write, which sets the present time, always changes it (VerifiedCache.record_written)
PIN_AGE_NS = 1_000_000_000


def identity(info: os.stat_result) -> tuple[int, int]:
    """Which file a stat names (device, inode): what a later check by name compares with."""
    return info.st_dev, info.st_ino


def staging_in_use(folder: Path) -> bool:
    """Whether a live process holds this staging directory (fsck leaves it alone then).

    A staging area may be filled without the store lock (an import quantizing a checkpoint for
    minutes must not block activations); its owner holds an flock on <dir>/.lock, which the
    kernel releases when the owner dies, so a crashed import's directory is junk again."""
    try:
        fd = os.open(folder / STAGING_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return held_elsewhere(fd)
    finally:
        os.close(fd)


@dataclass
class Staging:
    """Blobs written to tmp/ and fsynced, not yet visible in objects/.

    Filling a staging area needs no store lock; `commit` does (it runs under it)."""

    objects: ObjectStore
    staged: dict[str, Path] = field(default_factory=dict)
    reused: set[str] = field(default_factory=set)  # already in objects/ when put: not staged again
    dir: Path | None = None
    _lock_fd: int | None = None
    _copied: set = field(default_factory=set)  # put_range's blobs whose source is not yet checked
    _syncs: Syncs = field(default_factory=Syncs)  # each staged file's fsync, in flight
    _made: dict = field(default_factory=dict)  # digest -> identity of the staged file it vouched for

    def _dir(self) -> Path:
        if self.dir is None:
            self.dir = fs.temp_name(self.objects.tmp_dir, "stage")
            fs.mkdir(self.dir, sync_parent=False)
            self._lock_fd = os.open(self.dir / STAGING_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        return self.dir

    def put(self, data: bytes | memoryview) -> str:
        """Stage one blob; returns its digest. Bytes already stored are not written again."""
        digest = dg.of_bytes(data)
        view = memoryview(data).cast("B")
        self._stage(digest, [view[at:at + _CHUNK * 16] for at in range(0, len(view), _CHUNK * 16)])
        return digest

    def put_range(self, digest: str, source: fs.FileRange) -> str:
        """Stage the bytes of `source` (a range of a file outside the store) as the blob
        `digest`, which the caller computed from those bytes. The kernel copies them (on the sync
        threads): this process never holds them. The caller owns the claim that the range still
        holds what it hashed: it calls `copies_checked()` once it has shown that (an import
        checks its source file did not change), and only then are the copies recorded as
        verified at commit."""
        pieces = [fs.FileRange(source.fd, source.offset + at, min(_CHUNK * 16, source.length - at))
                  for at in range(0, source.length, _CHUNK * 16)]
        if self._stage(digest, pieces):
            self._copied.add(digest)
        return digest

    def _stage(self, digest: str, pieces: list) -> bool:
        """Write the blob `digest` from `pieces` (bytes or file ranges), written and fsynced on
        the sync threads, durable before commit links it (Syncs.wait); False, nothing written,
        when it is staged or stored already."""
        if digest in self.staged:
            return False
        if self._already_stored(digest):
            self.reused.add(digest)
            return False
        path = self._dir() / dg.hex_of(digest)
        with fs.NewFile(path, 0o644) as f:
            self._made[digest] = identity(os.fstat(f.fd))
            self._syncs.write_sync_and_close(f, pieces)
        self.staged[digest] = path
        return True

    def _name_kept(self, path: Path, digest: str) -> Path:
        """Where a blob received whole (`Incoming.keep`) stays until commit: where it was written
        (slm.store.resumable names it by its digest, for the next receive to find)."""
        return path

    def flush(self) -> None:
        """Wait until every staged file is written and fsynced (the first failure is raised)."""
        self._syncs.wait()

    def copies_checked(self) -> None:
        """The sources of `put_range` still hold the bytes that were hashed (see put_range)."""
        self._copied.clear()

    def incoming(self) -> "Incoming":
        """A blob to be staged as its bytes arrive (a received bundle's layer), hashed on the
        way: nothing is held whole. Use as a context manager; see Incoming."""
        return Incoming(self)

    def _already_stored(self, digest: str) -> bool:
        if not self.objects.has(digest):
            return False
        if not self.objects.verify(digest):
            raise IntegrityError(
                f"blob {dg.short(digest)} exists but is corrupt; run `slm fsck --repair` first"
            )
        return True

    def commit(self) -> list[str]:
        """Move staged blobs into objects/; returns the digests that are new in the store.

        All or nothing: if a link or the directory fsync fails, the blobs this commit added
        are unlinked again before the error propagates (best effort: `slm gc` removes what a
        refusing disk leaves). Runs under the store lock; a blob that was already stored when
        it was put and has gone since (a gc in between) fails the commit before any change."""
        self._syncs.wait()  # the barrier: every staged file's fsync has returned
        gone = [d for d in self.reused if not self.objects.has(d)]
        if gone:
            raise Busy(f"blob {dg.short(gone[0])}, already stored when this import began, was removed "
                       "since (a concurrent gc); run the import again")
        created = fs.mkdir(self.objects.dir, sync_parent=True)
        new: list[str] = []
        written: list[str] = []  # new blobs this process hashed as it staged them
        pinned = time.time_ns() - PIN_AGE_NS
        try:
            for digest, path in self.staged.items():
                target = self.objects.path(digest)
                vouched = digest not in self._copied and fs.pin_mtime(path, pinned)
                fs.chmod(path, BLOB_MODE)
                if fs.link_new(path, target):
                    new.append(digest)
                    self._check_linked(digest, target)
                    if vouched:
                        written.append(digest)
            if new or created:
                fs.fsync_dir(self.objects.dir)
            self.discard()  # (unlinks the staged names: a blob's ctime moves once more)
        except BaseException:
            try:
                self.objects.remove_new(new)
            except SlmError:
                pass
            raise
        self._record_written(written, pinned)  # (advisory: after the commit, outside its undo)
        return new

    def _check_linked(self, digest: str, target: Path) -> None:
        """Commit links by name: the file it linked must be the one staged (tmp/ is writable by
        whoever can write the store; another file renamed over the name would enter unverified)."""
        try:
            linked = identity(os.lstat(target))
        except OSError:
            linked = None
        if linked is None or linked != self._made.get(digest):
            raise IntegrityError(f"staged blob {dg.short(digest)} was replaced in tmp/ before commit; run it again")

    def _record_written(self, digests: list[str], pinned: int) -> None:
        """Blobs this process hashed as it staged them are verified already: recorded so, so
        that the first activation after an import need not re-hash them (slm.store.verified)."""
        if self.objects.verified is None or not digests:
            return
        for digest in digests:
            try:
                info = os.lstat(self.objects.path(digest))
            except OSError:
                continue
            self.objects.verified.record_written(digest, info, pinned)
        self.objects.save_verified()

    def discard(self) -> None:
        self._syncs.close()
        if self.dir is not None and self.dir.exists():
            fs.remove_tree(self.dir)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.dir = None
        self.staged = {}
        self._copied = set()
        self._made = {}


class Incoming:
    """One blob written into a staging area chunk by chunk while BLAKE3 hashes it.

    The caller checks what it knows of the bytes (their size, another digest, `digest`) and
    then calls `keep()`: only then is the file staged under its digest (fsynced with the rest,
    committed by `Staging.commit`). Leaving the `with` block without `keep()` (an error, bytes
    that do not match) removes the file: a refused blob leaves nothing in tmp/."""

    def __init__(self, staging: Staging):
        self.staging = staging
        self.path = fs.temp_name(staging._dir(), "incoming")
        self.file = fs.NewFile(self.path, 0o644)
        self._hasher = dg.hasher()
        self._kept = False

    def write(self, chunk: bytes | memoryview) -> None:
        self._hasher.update(chunk)
        self.file.write(chunk)

    @property
    def digest(self) -> str:
        return dg.PREFIX + self._hasher.hexdigest()

    def keep(self) -> str:
        """Stage the bytes written under their digest (returned)."""
        digest = self.digest
        if digest in self.staging.staged or self.staging._already_stored(digest):
            if digest not in self.staging.staged:
                self.staging.reused.add(digest)
            return digest  # not kept: __exit__ removes the copy
        self.staging._made[digest] = identity(os.fstat(self.file.fd))
        self.staging._syncs.write_sync_and_close(self.file, [])  # fsynced before commit links it
        self.staging.staged[digest] = self.staging._name_kept(self.path, digest)
        self._kept = True
        return digest

    def __enter__(self) -> "Incoming":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._kept:
            self.file._close()
            try:
                fs.unlink(self.path)
            except SlmError:
                pass  # the staging directory goes as a whole at discard()
