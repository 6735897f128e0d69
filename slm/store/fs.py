"""The one door through which every store write passes (objects, names, refs, reflog, journal,
config, and the derived cache/; tests/unit/test_structure.py checks no other module writes files).
Files outside the store that a user names (`slm export -o`, `slm run --logits-out`, `slm
verify --certificate`) are written through this layer too, by slm.store.outputs: the same
temp + fsync + rename protocol, the same fault points and power-cut matrix.

Why a layer: durability is a protocol (write, fsync, rename, fsync the directory) and it is
only as good as its weakest call site. Routing every mutation through these functions keeps
the protocol in one place and gives crash tests a single seam to inject faults at
(SQLite's test6.c idea): each operation first calls `_fault_point`, which the test hook in
`slm.store.testing.faults` may turn into a crash or an I/O error.

Rule: after a failed fsync we never retry; the kernel may already have dropped the dirty
pages, so the operation fails (the caller rolls back).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from slm.errors import IntegrityError, IOFailure
from slm.store import fs_direct

# Set by slm.store.testing.faults when a fault plan is active (tests only); None in normal runs.
fault_hook: Callable[[str, str], None] | None = None
# Set by the power-cut simulator (slm.store.testing.powercut, tests only): told of every fsync that
# returned, so that it knows exactly what a power cut could no longer take away.
sync_observer: Callable[[int, Path], None] | None = None


def _fault_point(op: str, detail: str) -> None:
    if fault_hook is not None:
        fault_hook(op, detail)


def _fsync(fd: int, path: os.PathLike | str) -> None:
    """fsync `fd` (a file or a directory opened at `path`): the one call through which the
    store makes anything durable, so the power-cut simulator sees each one that succeeded."""
    os.fsync(fd)
    if sync_observer is not None:
        sync_observer(fd, Path(path))


def point(name: str) -> None:
    """A named point in a protocol (e.g. 'activate.before-swap') where a test may crash us."""
    _fault_point("point", name)


def _io_error(what: str, path: os.PathLike | str, err: OSError) -> IOFailure:
    reason = os.strerror(err.errno) if err.errno else str(err)
    return IOFailure(f"cannot {what} {path}: {reason}")


def read_store_file(path: Path, limit: int, remedy: str = "run `slm fsck`") -> bytes | None:
    """The bytes of a small store file (a ref, a name, an intent, the reflog, config.toml), or
    None if it does not exist. `remedy` ends the message of a damaged file: what to do about
    it (fsck itself reads config.toml, so config.toml's remedy cannot be to run fsck).

    The recovery tool must never hang and never follow a link planted in the store: the file
    is opened with O_NOFOLLOW | O_NONBLOCK (a FIFO in its place opens at once instead of
    waiting for a writer) and anything but a regular file, or a file over `limit` bytes, is
    refused as damage (IntegrityError) before a byte is read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise IntegrityError(f"{path} is a symlink; the store refuses links ({remedy})") from err
        if err.errno == errno.ENOTDIR:
            return None  # a parent is not a directory: fsck reports the parent
        raise _io_error("open", path, err) from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a directory" if stat.S_ISDIR(info.st_mode) else
                    "a FIFO, not a regular file" if stat.S_ISFIFO(info.st_mode) else "not a regular file")
            raise IntegrityError(f"{path} is {kind} ({remedy})")
        if info.st_size > limit:
            raise IntegrityError(f"{path} is {info.st_size} bytes, more than a store file of its "
                                 f"kind can be ({limit}) ({remedy})")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while we read it
            raise IntegrityError(f"{path} is larger than a store file of its kind can be ({limit})")
        return b"".join(chunks)
    except OSError as err:
        raise _io_error("read", path, err) from err
    finally:
        os.close(fd)


def mkdir(path: Path, *, sync_parent: bool = True) -> bool:
    """Create a directory if missing; fsync its parent so the entry survives a crash.

    Returns True if it was created.
    """
    if path.is_dir():
        return False
    _fault_point("mkdir", str(path))
    try:
        path.mkdir()
    except FileExistsError:
        return False
    except OSError as err:
        raise _io_error("create directory", path, err) from err
    if sync_parent:
        fsync_dir(path.parent)
    return True


def fsync_dir(path: Path) -> None:
    _fault_point("fsync_dir", str(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise _io_error("open directory", path, err) from err
    try:
        _fsync(fd, path)
    except OSError as err:
        raise _io_error("fsync directory", path, err) from err
    finally:
        os.close(fd)


@dataclass(frozen=True)
class FileRange:
    """`length` bytes at `offset` of the open file `fd` (outside the store: an import's source),
    to be copied into a new file by the kernel (`NewFile.write` of one): the bytes never pass
    through this process's memory."""

    fd: int
    offset: int
    length: int

    def __len__(self) -> int:
        return self.length


# copy_file_range(2) refusing these means "not between these two files": copy through a buffer
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF)
_COPY_BUFFER = 1 << 20


class NewFile:
    """A file created exclusively (O_EXCL), written, fsynced and closed.

    Use as a context manager; on an exception the file is closed and removed.
    """

    def __init__(self, path: Path, mode: int = 0o644):
        _fault_point("create", str(path))
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except OSError as err:
            raise _io_error("create", path, err) from err
        self.path = path
        self.size = 0
        self._closed = False

    def write(self, data: bytes | memoryview | FileRange) -> None:
        _fault_point("write", str(self.path))
        self._write_now(data)

    def _write_now(self, data: bytes | memoryview | FileRange) -> None:
        if isinstance(data, FileRange):
            self._copy_now(data)
            return
        view = memoryview(data).cast("B")
        while view:
            try:
                n = os.write(self.fd, view)
            except OSError as err:
                raise _io_error("write", self.path, err) from err
            view = view[n:]
            self.size += n

    def _copy_now(self, source: FileRange) -> None:
        """Append `source`'s bytes: copy_file_range(2) (the kernel copies page to page), or
        where it cannot (another filesystem on an old kernel, no such call) through a bounded
        buffer. A source that ends early is an I/O failure (it shrank under us). Its whole
        aligned blocks first go by O_DIRECT where the file system takes it (slm.store.fs_direct)."""
        try:
            done = fs_direct.copy_aligned(source.fd, source.offset, source.length, self.fd, self.size)
        except OSError as err:
            raise _io_error("write", self.path, err) from err
        self.size += done
        kernel_copy = getattr(os, "copy_file_range", None)
        while done < source.length:
            at, want = source.offset + done, source.length - done
            if kernel_copy is not None:
                try:
                    n = kernel_copy(source.fd, self.fd, want, at)
                except OSError as err:
                    if err.errno not in _NO_KERNEL_COPY:
                        raise _io_error("write", self.path, err) from err
                    kernel_copy = None  # through a buffer from here on
                    continue
                self.size += n
            else:
                try:
                    chunk = os.pread(source.fd, min(want, _COPY_BUFFER), at)
                except OSError as err:
                    raise _io_error("write (reading its source)", self.path, err) from err
                self._write_now(chunk)
                n = len(chunk)
            if n == 0:
                raise IOFailure(f"cannot write {self.path}: its source ended {want} bytes early "
                                "(the file shrank while it was read)")
            done += n

    def sync_and_close(self) -> None:
        _fault_point("fsync", str(self.path))
        self._sync_and_close_now()

    def _sync_and_close_now(self) -> None:
        try:
            _fsync(self.fd, self.path)
        except OSError as err:
            raise _io_error("fsync", self.path, err) from err
        finally:
            self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self.fd)

    def __enter__(self) -> "NewFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._close()
            try:
                os.unlink(self.path)
            except OSError:
                pass
        elif not self._handed_off:
            self._close()

    _handed_off = False  # set when a Syncs pool owns the descriptor (it closes it after the fsync)


def temp_name(directory: Path, stem: str) -> Path:
    """A fresh temp path in `directory` (same filesystem, so a later rename is atomic)."""
    # os.urandom, not the secrets module: secrets imports hashlib and hmac (start-up time of
    # every command); a temp name needs uniqueness, not a cryptographic API
    return directory / f".{stem}.{os.getpid()}.{os.urandom(6).hex()}.tmp"


def rename(src: Path, dst: Path, *, replace: bool = True) -> None:
    """rename(2); with replace=False a name that exists at dst (even one that appeared a moment
    ago) is never replaced: FileExistsError."""
    _fault_point("rename", f"{src} -> {dst}")
    try:
        os.rename(src, dst) if replace else _rename_noreplace(src, dst)
    except OSError as err:
        if not replace and isinstance(err, FileExistsError):
            raise
        raise _io_error("rename", f"{src} to", err) from err


def _rename_noreplace(src: Path, dst: Path) -> None:
    """Linux renameat2(RENAME_NOREPLACE); where the libc, kernel or filesystem lacks it, a check
    then rename (a narrow window remains there). OSError(EEXIST) is a FileExistsError."""
    import ctypes

    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is not None:
        at_fdcwd, noreplace = -100, 1
        if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(code, os.strerror(code), str(dst))
    if os.path.lexists(dst):
        raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


def link_new(src: Path, dst: Path) -> bool:
    """Hard-link src to dst unless dst exists (first writer wins). True if we created it."""
    _fault_point("link", f"{src} -> {dst}")
    try:
        os.link(src, dst)
    except FileExistsError:
        return False
    except OSError as err:
        if err.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
            raise _io_error("hard-link (the store needs a filesystem with links)", dst, err) from err
        raise _io_error("link", dst, err) from err
    return True


def unlink(path: Path, *, missing_ok: bool = True) -> None:
    _fault_point("unlink", str(path))
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
    except OSError as err:
        raise _io_error("remove", path, err) from err


def chmod(path: Path, mode: int) -> None:
    _fault_point("chmod", str(path))
    try:
        os.chmod(path, mode)
    except OSError as err:
        raise _io_error("chmod", path, err) from err


def atomic_replace(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` so that a reader or a crash sees old or new, never a mix.

    write temp (O_EXCL, same dir) -> fsync -> close -> rename over path -> fsync dir.
    """
    tmp = temp_name(path.parent, path.name)
    with NewFile(tmp, mode) as f:
        f.write(data)
        f.sync_and_close()
    try:
        rename(tmp, path)
    except BaseException:
        unlink(tmp)
        raise
    fsync_dir(path.parent)


def append_durably(path: Path, data: bytes) -> None:
    """Append one record to a log file and fsync it (the caller checksums the record)."""
    _fault_point("append", str(path))
    created = not path.exists()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise _io_error("open for append", path, err) from err
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        _fault_point("fsync", str(path))
        _fsync(fd, path)
    except OSError as err:
        raise _io_error("append to", path, err) from err
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


def write_advisory(path: Path, data: bytes) -> None:
    """Overwrite a derived, advisory file in place, with no fsync and no temp file: only for
    data its reader checks and may discard (the verified-digest cache, slm.store.verified). A
    crash, a power cut or a concurrent writer may leave it old, torn, empty or mixed; the
    reader's checksum tells, and nothing is lost but the time to rebuild it.

    No fault point: a failure here fails no command (the caller ignores it), and the crash
    and I/O-error tests count the operations whose failure must fail the command. Opened
    like a store file (O_NOFOLLOW | O_NONBLOCK), and cut only once it is known to be a regular
    file of one link: a symlink, a FIFO or a hard link to a blob in its place is left alone."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise _io_error("open", path, err) from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise IntegrityError(f"{path} is not a regular file of one link; left alone")
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as err:
        raise _io_error("write", path, err) from err
    finally:
        os.close(fd)


def pin_mtime(path: Path, mtime_ns: int) -> bool:
    """Set a new file's mtime to `mtime_ns`, a time already past: any later write to it sets
    the mtime to the present, which the file's key then shows whatever the clock's tick
    (slm.store.verified: how a blob written by this process is recorded as verified). Advisory:
    False if it could not be done; no fault point (nothing fails for it)."""
    try:
        os.utime(path, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
    except OSError:
        return False
    return True


def truncate(path: Path, size: int) -> None:
    """Cut a file to `size` bytes and fsync it (drops a torn log tail)."""
    _fault_point("truncate", f"{path} to {size}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as err:
        raise _io_error("open", path, err) from err
    try:
        os.ftruncate(fd, size)
        _fsync(fd, path)
    except OSError as err:
        raise _io_error("truncate", path, err) from err
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Remove a staging directory or other junk (best effort: junk may be half gone)."""
    _fault_point("rmtree", str(path))
    shutil.rmtree(path, ignore_errors=True)


def remove_any(path: Path) -> None:
    """Remove whatever stands at `path` (file, FIFO, symlink or directory tree) and fsync its
    directory: how fsck clears a damaged entry that may not even be a file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise _io_error("inspect", path, err) from err
    if stat.S_ISDIR(mode):
        remove_tree(path)
        if path.exists():
            raise IOFailure(f"cannot remove {path}")
    else:
        unlink(path)
    fsync_dir(path.parent)
