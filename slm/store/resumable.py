"""A staging area that outlives the process filling it: what an interrupted receive keeps.

`ResumableStaging` is a `Staging` at a fixed place, tmp/pull-<key>/ (the key: the sha256 hex of
the manifest received), instead of a fresh temp directory. Each blob that arrived whole and
verified is named there by its BLAKE3 hex, so a receive killed after K of N blobs leaves
those K, and the next receive of the same key finds them. Nothing found there is trusted:
tmp/ is writable by whoever can write the store, so the receiver re-hashes a kept blob
against its descriptor before it adopts it (`open_kept` only refuses what is not even a
plain file of this user's), and drops it otherwise. The area itself must be a directory of
this user's that no one else can write (`_planted`): its name is predictable, and commit links
a kept blob by its name there; another is removed and made afresh, nothing in it reused. A
blob cut off mid-way is never named by its digest; its temp file is removed when the area is
claimed again.

One process at a time: the area is claimed with an flock on its .lock (the kernel releases
it when the owner dies); a second receive of the same key is refused (`Busy`, exit 7). The
area is removed when its receive commits or is refused (`Staging.discard`), kept when it is
interrupted (`release`). `slm fsck --repair` and `slm gc` remove one nobody holds once it is
older than KEEP_FOR_S (`abandoned`); `slm gc --prune-now` at once.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from slm.errors import Busy, IOFailure
from slm.store import digest as dg
from slm.store import fs
from slm.store.objects import STAGING_LOCK, Staging, identity, staging_in_use

PREFIX = "pull-"
KEEP_FOR_S = 24 * 3600  # an interrupted pull resumes within a day; after that its bytes are junk
_CLAIM_TRIES = 3
_AREA_MODE = 0o755


def area_of(tmp_dir: Path, key: str) -> Path:
    return tmp_dir / f"{PREFIX}{key}"


def is_area(path: Path) -> bool:
    """Whether `path` is named as a resumable staging area (tmp/pull-<64 hex>)."""
    key = path.name.removeprefix(PREFIX)
    return path.name.startswith(PREFIX) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)


def age_s(path: Path) -> float:
    """Seconds since the area last changed (a blob kept or a leftover removed moves its mtime)."""
    try:
        return max(0.0, time.time() - os.lstat(path).st_mtime)
    except OSError:
        return 0.0


def kept(path: Path, keep_for_s: float = KEEP_FOR_S) -> bool:
    """Whether `path` is a resumable staging area to leave alone: held by a live receive, or
    changed in the last `keep_for_s` seconds (an interrupted pull that the next one resumes)."""
    return (is_area(path) and not path.is_symlink() and path.is_dir()
            and (staging_in_use(path) or age_s(path) <= keep_for_s))


def abandoned(tmp_dir: Path, keep_for_s: float) -> list[Path]:
    """The resumable staging areas nobody holds that last changed more than `keep_for_s` seconds ago."""
    if not tmp_dir.is_dir():
        return []
    return [p for p in sorted(tmp_dir.iterdir())
            if is_area(p) and not p.is_symlink() and p.is_dir() and not kept(p, keep_for_s)]


def remove_abandoned(area: Path) -> None:
    """Remove a staging area unless a receive claims it: removed under its own claim, so that a
    receive claiming it at this moment gets the area whole or a fresh one (`_claim`). One whose
    .lock was planted cannot be claimed by anyone: it is junk, removed as it is."""
    if _lock_planted(area):
        fs.remove_any(area)
        return
    try:
        fd = _claim_existing(area)
    except (Busy, FileNotFoundError):
        return
    try:
        fs.remove_tree(area)
    finally:
        os.close(fd)


def _claim_existing(area: Path) -> int:
    """An exclusive flock on the .lock of an area that exists; Busy if a receive holds it."""
    lock = area / STAGING_LOCK
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise IOFailure(f"cannot open {lock}: {os.strerror(err.errno)}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino == os.lstat(lock).st_ino:
            return fd
    except BlockingIOError:
        os.close(fd)
        raise Busy(f"another pull of the same manifest is receiving into this store (tmp/{area.name}); "
                   "wait for it to finish, or try again") from None
    except FileNotFoundError:
        pass
    os.close(fd)
    raise FileNotFoundError(lock)


def _planted(area: Path) -> bool:
    """Whether what stands at `area` is not an area this user made: not a directory (a
    symlink, a FIFO), its .lock no plain file, another's, or one others can write (its name
    is predictable, so one who can write tmp/ can make it first, then swap a kept blob there
    after the receive re-hashed it and before commit links it by name)."""
    try:
        info = os.lstat(area)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise IOFailure(f"cannot inspect {area}: {os.strerror(err.errno)}") from err
    return (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or bool(info.st_mode & 0o022)
            or _lock_planted(area))


def _lock_planted(area: Path) -> bool:
    """Whether the area's .lock is there but no file this store makes (a symlink, a directory):
    no receive could ever claim the area again."""
    try:
        return not stat.S_ISREG(os.lstat(area / STAGING_LOCK).st_mode)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise IOFailure(f"cannot inspect {area / STAGING_LOCK}: {os.strerror(err.errno)}") from err


def _claim(area: Path) -> int:
    """An exclusive flock on the area's .lock, created with the area if missing. A .lock that
    is no longer the one at its path once locked (the area was removed meanwhile, by fsck or
    gc) is no claim: tried again."""
    for _ in range(_CLAIM_TRIES):
        if _planted(area):
            fs.remove_any(area)
        if fs.mkdir(area, sync_parent=False):
            fs.chmod(area, _AREA_MODE)  # whatever the umask: no one else may rename a blob in it
        try:
            return _claim_existing(area)
        except FileNotFoundError:
            continue
    raise IOFailure(f"cannot claim the staging area tmp/{area.name}: it keeps being removed")


@dataclass
class ResumableStaging(Staging):
    """A `Staging` at tmp/pull-<key>/ that an interrupted receive leaves for the next one."""

    key: str = ""

    @property
    def area(self) -> Path:
        return area_of(self.objects.tmp_dir, self.key)

    def _dir(self) -> Path:
        if self.dir is None:
            fd = _claim(self.area)
            self.dir, self._lock_fd = self.area, fd
            for entry in os.scandir(self.area):  # a blob cut off mid-way: never named by its digest
                if entry.name != STAGING_LOCK and not dg.is_digest(dg.PREFIX + entry.name):
                    fs.remove_any(Path(entry.path))
        return self.dir

    def open_kept(self, digest: str, size: int) -> int | None:
        """A descriptor on the file kept under `digest` by an earlier receive, not yet verified
        (the caller re-hashes it, then `adopt`s or `drop`s it); None when there is none, and
        none (the file dropped) when it cannot be the one a receive of this user wrote: not a
        plain file, another owner, another name for it, writable by others, or not `size` bytes.
        Claims the area first if it exists (a second receive of the key waits on no one: Busy)."""
        if digest in self.staged or not dg.is_digest(digest):
            return None
        if self.dir is None and not self.area.is_dir():
            return None
        path = self._dir() / dg.hex_of(digest)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise IOFailure(f"cannot read {path}: {os.strerror(err.errno)}") from err
            self.drop(digest)
            return None
        info = os.fstat(fd)
        if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1
                or info.st_mode & 0o022 or info.st_size != size):
            os.close(fd)
            self.drop(digest)
            return None
        self._made[digest] = identity(info)  # what commit checks it linked: the file re-hashed
        return fd

    def adopt(self, digest: str) -> None:
        """The kept file of `digest` was re-hashed and matched: staged as if written now."""
        self.staged[digest] = self._dir() / dg.hex_of(digest)

    def drop(self, digest: str) -> None:
        """Remove the kept file of `digest` (it did not verify, or cannot be trusted)."""
        self._made.pop(digest, None)
        fs.remove_any(self._dir() / dg.hex_of(digest))

    def _stage(self, digest: str, pieces: list) -> bool:
        if digest not in self.staged and (self.dir is not None or self.area.is_dir()):
            fs.unlink(self._dir() / dg.hex_of(digest))  # a kept file not adopted: written afresh
        return super()._stage(digest, pieces)

    def _name_kept(self, path: Path, digest: str) -> Path:
        """A blob received whole and verified takes its digest's name: the next receive finds it."""
        named = self._dir() / dg.hex_of(digest)
        fs.rename(path, named)
        return named

    def release(self) -> None:
        """Leave the area for the next receive of the key, its claim let go. Its fsyncs are
        waited for, their failures ignored: a kept blob that is not durable comes back torn
        after a power cut, and is re-hashed before reuse anyway."""
        self._syncs.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.dir = None
        self.staged, self._made = {}, {}
