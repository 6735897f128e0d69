"""The one reader of files someone else wrote: a bundle's members, key files, certificates.

Every such file is opened here, and only as a regular file:

- O_NONBLOCK: a FIFO in its place opens at once (and is refused) instead of waiting for a
  writer that never comes; O_NOFOLLOW for every file inside something untrusted (a bundle
  cannot point slm at /etc/shadow or /dev/zero); a file the user names on the command line
  is followed if it is a link (secrets are often mounted as links), never if it is a FIFO;
- its size comes from fstat before a byte is read, so the caller refuses a file larger than
  what it may hold (a manifest, a key) or of another size than its descriptor says (a blob)
  before reading it;
- reading is bounded by that limit even if the file grows meanwhile, and big files are read
  in chunks (`chunks`) that the caller hashes and writes on: nothing is held whole;
- a pipe, where a caller takes one (a small document the user may give as `<(...)`), is read
  within a deadline (`pipe_wait`): a FIFO nothing writes to, or a writer that never finishes,
  is refused when it passes, never waited on for ever.

Why here, and not in slm/store/fs.py (which has the same open for the store's own files):
a strange file in the store is damage (IntegrityError, "run slm fsck"), a strange file given
to slm is bad input (exit 4), one the OS cannot read an I/O failure (exit 12); and the store
layer knows nothing of bundles or keys. slm/formats is the lowest layer that reads what users
bring (GGUF, safetensors, JSON), so every layer above (dist, ops) can use this one door.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from pathlib import Path
from typing import BinaryIO, Iterator

from slm.errors import InvalidInput, IOFailure, NotFound

CHUNK = 1 << 20
PIPE_WAIT_S = 30.0  # how long a pipe the user names may take to send the whole document
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


def kind_of(mode: int) -> str:
    """What kind of file a mode is, in words (for messages)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _reason(err: OSError) -> str:
    return os.strerror(err.errno) if err.errno else str(err)


class UntrustedFile:
    """A regular file opened for reading, its size known (`size`) before any byte is read; or
    a pipe (size 0) whose every byte must come before `deadline` (time.monotonic())."""

    def __init__(self, fd: int, name: str, size: int, deadline: float | None = None):
        self.fd, self.name, self.size, self.deadline = fd, name, size, deadline

    def _wait_for_data(self) -> None:
        """Until the pipe has bytes or its writer is gone (EOF); InvalidInput past the deadline."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        left = self.deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise InvalidInput(f"{self.name} is a pipe that did not send all of itself in time "
                               "(does anything write to it?)")

    def read_some(self, n: int) -> bytes:
        if self.deadline is not None:
            self._wait_for_data()
        try:
            return os.read(self.fd, n)
        except OSError as err:
            raise IOFailure(f"cannot read {self.name}: {_reason(err)}") from err

    def chunks(self, limit: int) -> Iterator[bytes]:
        """The file's bytes in chunks, stopping after `limit` + 1 of them at most (one more than
        the caller accepts, so that a file longer than it should be is seen, not read to its end)."""
        left = limit + 1
        while left > 0:
            chunk = self.read_some(min(CHUNK, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk

    def read_all(self, limit: int, what: str = "file") -> bytes:
        """The whole file, refused (exit 4) if it is or becomes larger than `limit` bytes."""
        if self.size > limit:
            raise InvalidInput(f"{self.name} is {self.size} bytes, more than a {what} can be ({limit})")
        data = b"".join(self.chunks(limit))
        if len(data) > limit:
            raise InvalidInput(f"{self.name} grew past {limit} bytes while it was read")
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "UntrustedFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_untrusted(path: os.PathLike | str, *, follow: bool = False, dir_fd: int | None = None,
                   name: str | None = None, pipe_wait: float | None = None) -> UntrustedFile:
    """Open a regular file someone else wrote. `follow`: the user named this path (a link is
    followed, as any program would); otherwise a link is refused. `dir_fd`: open `path`
    relative to that directory (a bundle's directories are held open, so a member cannot be
    swapped for a link between the check and the open). `name`: how messages call it.
    `pipe_wait`: a pipe or FIFO is taken too, if it sends all of itself within that many seconds.

    Missing: NotFound (exit 3). A link (unless followed), a directory, FIFO, device or socket:
    InvalidInput (exit 4). The OS refusing the open or a read (EACCES, EIO): IOFailure (exit 12)."""
    name = name or str(path)
    flags = _FLAGS | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError as err:
        raise NotFound(f"no such file: {name}") from err
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise InvalidInput(f"{name} is a symlink; links are refused") from err
        if err.errno == errno.ENOTDIR:
            raise NotFound(f"no such file: {name} (a parent is not a directory)") from err
        raise IOFailure(f"cannot open {name}: {_reason(err)}") from err
    try:
        info = os.fstat(fd)
    except OSError as err:
        os.close(fd)
        raise IOFailure(f"cannot read {name}: {_reason(err)}") from err
    if stat.S_ISFIFO(info.st_mode) and pipe_wait is not None:
        return UntrustedFile(fd, name, 0, time.monotonic() + pipe_wait)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise InvalidInput(f"{name} is {kind_of(info.st_mode)}, not a regular file")
    return UntrustedFile(fd, name, info.st_size)


def open_binary(path: Path | str) -> BinaryIO:
    """`open(path, "rb")` for a file the user names (a GGUF, a safetensors file), through the
    checks of `open_untrusted`: a FIFO or a device is refused at once, never waited on."""
    f = open_untrusted(path, follow=True)
    fd, f.fd = f.fd, -1  # the file object owns the descriptor now
    return os.fdopen(fd, "rb")


def read_untrusted(path: Path | str, limit: int, what: str = "file", *, follow: bool = True,
                   pipe_wait: float | None = None) -> bytes:
    """The bytes of a small file the user named (a key, a certificate): at most `limit` of them,
    a larger file refused before it is read (`pipe_wait`: as open_untrusted's)."""
    with open_untrusted(path, follow=follow, pipe_wait=pipe_wait) as f:
        return f.read_all(limit, what)
