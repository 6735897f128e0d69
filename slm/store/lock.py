"""One writer at a time: every command that changes the store holds `.slm/lock`.

Readers never take it: they read refs and blobs that are only ever replaced atomically.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import filelock

from slm.errors import Busy

DEFAULT_TIMEOUT_S = 30.0


@contextmanager
def store_lock(path: Path, timeout: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    lock = filelock.FileLock(str(path), timeout=timeout)
    try:
        lock.acquire()
    except filelock.Timeout as err:
        raise Busy(
            f"another slm process holds the store lock {path} (waited {timeout:g}s); "
            "try again, or raise --lock-timeout"
        ) from err
    try:
        yield
    finally:
        lock.release()
