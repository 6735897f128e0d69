"""One writer at a time: every command that changes the store holds `.slm/lock`.

Readers never take it: they read refs and blobs that are only ever replaced atomically.

The lock is an flock(2) on the lock file, which the kernel drops when its holder dies (a
crashed writer never leaves the store locked). Re-entrant within one thread (a verb that
reads and switches under one lock calls `switch`, which takes it again); another thread of
the same process waits for it like another process does (each holder opens the file, and
flock locks belong to the open file). Written here with fcntl rather than through the
filelock package: that import was a tenth of `slm activate`'s start-up.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from slm.errors import Busy, IOFailure

DEFAULT_TIMEOUT_S = 30.0
POLL_S = 0.05

_held = threading.local()  # .depth: {lock path: how many times this thread holds it}


@contextmanager
def store_lock(path: Path, timeout: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    depth: dict[str, int] = _held.__dict__.setdefault("depth", {})
    key = str(path)
    if depth.get(key):
        depth[key] += 1
        try:
            yield
        finally:
            depth[key] -= 1
        return
    fd = _acquire(path, timeout)
    depth[key] = 1
    try:
        yield
    finally:
        del depth[key]
        os.close(fd)  # closing the last descriptor of the open file releases the flock


def _acquire(path: Path, timeout: float) -> int:
    try:
        # never through a link planted in the store: O_CREAT would make its target, wherever it points
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:  # a read-only or permission-denied store, or damage (a link) in place of the lock
        raise IOFailure(f"cannot lock the store ({path}): {err.strerror or err}") from err
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise Busy(
                    f"another slm process holds the store lock {path} (waited {timeout:g}s); "
                    "try again, or raise lock_timeout_s in the store's config.toml"
                ) from None
            time.sleep(POLL_S)
        except OSError as err:
            os.close(fd)
            raise IOFailure(f"cannot lock the store ({path}): {err.strerror or err}") from err


def held_elsewhere(fd: int) -> bool:
    """Whether another open file holds an exclusive flock on what `fd` opened: a probe (a shared
    lock asked without waiting; the caller's close of `fd` releases it). A file system that
    refuses flock answers no."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
