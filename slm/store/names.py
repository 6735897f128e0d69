"""Human names -> digests: names/<kind>/<name>, one line `blake3:<hex>` each.

A name file is replaced atomically (fs.atomic_replace), so readers see old or new.
"""

from __future__ import annotations

import re
from pathlib import Path

from slm.errors import IntegrityError, InvalidInput, NotFound
from slm.store import digest as dg
from slm.store import fs

KINDS = ("bases", "adapters", "compositions")
# names beside a base, keyed by its digest's hex, not looked up by users (slm.ops.resolve
# searches KINDS only): "gguf" -> the record of the GGUF file it was imported from
# (slm.formats.gguf_frame), "origins" -> where it was imported from (slm.formats.base_origin);
# kept by gc while the base is
SIDE_KINDS = ("gguf", "origins")
MAX_NAME_FILE_BYTES = 4096
# Letters, digits, '.', '_', '-'; starts with a letter or digit; no separators, no '..'.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def validate_name(name: str) -> str:
    if not _NAME.fullmatch(name) or ".." in name:
        shown = name.encode("unicode_escape").decode("ascii")
        raise InvalidInput(
            f"invalid name {shown!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no path separators, no '..')"
        )
    return name


class Names:
    def __init__(self, root: Path):
        self.root = root

    def _path(self, kind: str, name: str) -> Path:
        if kind not in KINDS and kind not in SIDE_KINDS:
            raise InvalidInput(f"unknown kind of name {kind!r} (one of {', '.join(KINDS)})")
        return self.root / kind / validate_name(name)

    def get(self, kind: str, name: str) -> str | None:
        data = fs.read_store_file(self._path(kind, name), MAX_NAME_FILE_BYTES)
        if data is None:
            return None
        try:
            text = data.decode("ascii").strip()
        except UnicodeDecodeError as err:
            raise IntegrityError(f"name {kind}/{name} is not ASCII text (run `slm fsck`)") from err
        if not dg.is_digest(text):
            raise IntegrityError(f"name {kind}/{name} does not hold a digest (run `slm fsck`)")
        return text

    def resolve(self, kind: str, name: str) -> str:
        found = self.get(kind, name)
        if found is None:
            raise NotFound(f"no {kind[:-1]} named {name!r}")
        return found

    def set(self, kind: str, name: str, digest: str) -> bool:
        """Point a name at a digest; returns False if it already pointed there."""
        if not dg.is_digest(digest):
            raise InvalidInput(f"cannot name {digest!r}: not a blake3 digest")
        if self.get(kind, name) == digest:
            return False
        fs.mkdir(self.root / kind)
        fs.atomic_replace(self._path(kind, name), (digest + "\n").encode("ascii"))
        return True

    def remove(self, kind: str, name: str) -> None:
        path = self._path(kind, name)
        if path.exists():
            fs.unlink(path)
            fs.fsync_dir(path.parent)

    def committed_at(self, kind: str, name: str) -> float | None:
        """When a name was last set (its file is replaced whole at each commit, so its
        modification time is that commit's); None if there is no such name."""
        try:
            return self._path(kind, name).stat().st_mtime
        except FileNotFoundError:
            return None

    def items(self, kind: str) -> list[tuple[str, str]]:
        """(name, digest) of every name of a kind; IntegrityError at the first damaged one."""
        out = []
        for name, digest, error in self.scan(kind):
            if error is not None:
                raise error
            out.append((name, digest))
        return out

    def scan(self, kind: str) -> list[tuple[str, str | None, IntegrityError | None]]:
        """Every name of a kind with its digest, or with the damage found in its file (fsck)."""
        folder = self.root / kind
        if not folder.is_dir():
            return []
        out = []
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith(".") or not _NAME.fullmatch(entry.name):
                continue  # temp files of an in-flight replace
            try:
                digest = self.get(kind, entry.name)
            except IntegrityError as err:
                out.append((entry.name, None, err))
                continue
            if digest is not None:
                out.append((entry.name, digest, None))
        return out
