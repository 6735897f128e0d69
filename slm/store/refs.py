"""refs/active: the one pointer that names the active composition.

    refs/active   "<composition id> <check>\n"   (a checked line: slm/store/checked_line.py)

Replaced with fs.atomic_replace (temp, fsync, rename, fsync dir), so a reader sees the old or
the new pointer, never a mix; the check catches a file that was damaged some other way.
"""

from __future__ import annotations

from pathlib import Path

from slm.errors import IntegrityError
from slm.store import checked_line
from slm.store import digest as dg
from slm.store import fs


MAX_REF_BYTES = 4096


def encode_ref(value: str) -> bytes:
    return checked_line.encode(value)


def decode_ref(data: bytes, where: str) -> str:
    value = checked_line.decode(data)
    if value is None or not dg.is_digest(value):
        raise IntegrityError(f"{where} is damaged (run `slm fsck`)")
    return value


class Ref:
    def __init__(self, path: Path):
        self.path = path

    def read(self) -> str | None:
        """The composition id, or None if nothing was ever activated."""
        data = fs.read_store_file(self.path, MAX_REF_BYTES)
        return None if data is None else decode_ref(data, str(self.path))

    def write(self, value: str) -> None:
        fs.point("ref.before-replace")
        fs.atomic_replace(self.path, encode_ref(value))
        fs.point("ref.after-replace")
