"""One writer at a time: every command that changes the store holds `.slm/lock`.

Readers never take it: they read refs and blobs that are only ever replaced atomically.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import filelock

from slm.errors import Busy, IOFailure

DEFAULT_TIMEOUT_S = 30.0


# One FileLock object per path, so that nested `with store.locked()` in one process re-enters
# (FileLock counts acquisitions per object) instead of waiting for itself.
_locks: dict[str, filelock.FileLock] = {}


@contextmanager
def store_lock(path: Path, timeout: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    lock = _locks.setdefault(str(path), filelock.FileLock(str(path)))
    try:
        lock.acquire(timeout=timeout)
    except filelock.Timeout as err:
        raise Busy(
            f"another slm process holds the store lock {path} (waited {timeout:g}s); "
            "try again, or raise lock_timeout_s in the store's config.toml"
        ) from err
    except OSError as err:  # a read-only or permission-denied store, or damage in place of the lock
        raise IOFailure(f"cannot lock the store ({path}): {err.strerror or err}") from err
    try:
        yield
    finally:
        lock.release()
