"""Human names -> digests: names/<kind>/<name>, one line `blake3:<hex>` each.

    bases, adapters   a name -> the manifest digest of a base or an adapter
    tags              a name -> a composition id (`slm tag prod smollm2+french@0.8`)
    remotes           a registry reference a composition was pulled under -> its id
                      (file name: the reference percent-encoded, e.g. host%3A5000%2Frepo%3Av1)
    compositions      <hex of a composition id> -> its manifest digest (records, not user names)

A name file is replaced atomically (fs.atomic_replace), so readers see old or new. Every user
name (all kinds but compositions) has a reflog, logs/names/<kind>/<file>, moved in the same
transaction as the name (slm.ops.store.naming: its line is the commit point).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote, unquote

from slm.errors import IntegrityError, InvalidInput, NotFound
from slm.store import digest as dg
from slm.store import fs
from slm.store.reflog import Reflog

KINDS = ("bases", "adapters", "compositions", "tags", "remotes")
NAMED_KINDS = ("bases", "adapters", "tags", "remotes")  # user names, each with a reflog
# names beside a base, keyed by its digest's hex, not looked up by users (slm.ops.store.resolve
# searches KINDS only): "gguf" -> the record of the GGUF file it was imported from
# (slm.formats.gguf_frame), "origins" -> where it was imported from (slm.formats.base_origin);
# kept by gc while the base is
SIDE_KINDS = ("gguf", "origins")
MAX_NAME_FILE_BYTES = 4096
# Letters, digits, '.', '_', '-'; starts with a letter or digit; no separators, no '..'.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# A registry reference as slm.distribution.reference prints it: host[:port]/path[:tag|@digest].
_REMOTE = re.compile(r"[A-Za-z0-9\[][A-Za-z0-9._:/@\[\]-]{0,254}")


def validate_name(name: str) -> str:
    if not _NAME.fullmatch(name) or ".." in name:
        shown = name.encode("unicode_escape").decode("ascii")
        raise InvalidInput(
            f"invalid name {shown!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no path separators, no '..')"
        )
    return name


def file_name(kind: str, name: str) -> str:
    """The file of a name in names/<kind>/ (and logs/names/<kind>/): the name itself, checked;
    a registry reference percent-encoded."""
    if kind not in KINDS and kind not in SIDE_KINDS:
        raise InvalidInput(f"unknown kind of name {kind!r} (one of {', '.join(KINDS)})")
    if kind != "remotes":
        return validate_name(name)
    if not _REMOTE.fullmatch(name) or ".." in name or "/" not in name:
        raise InvalidInput(f"invalid registry reference {name.encode('unicode_escape').decode('ascii')!r}")
    return quote(name, safe="")


def name_of_file(kind: str, file: str) -> str | None:
    """The name a file in names/<kind>/ holds, None for anything else (a temp file)."""
    name = unquote(file) if kind == "remotes" else file
    try:
        return name if file_name(kind, name) == file else None
    except InvalidInput:
        return None


class Names:
    def __init__(self, root: Path):
        self.root = root
        self.logs_root = root.parent / "logs" / "names"

    def _path(self, kind: str, name: str) -> Path:
        return self.root / kind / file_name(kind, name)

    def log(self, kind: str, name: str) -> Reflog:
        """The reflog of a user name (kept after the name is removed: its history)."""
        if kind not in NAMED_KINDS:
            raise InvalidInput(f"names of kind {kind!r} have no log")
        return Reflog(self.logs_root / kind / file_name(kind, name), deletions=True)

    def logged(self, kind: str) -> list[tuple[str, Reflog]]:
        """(name, reflog) of every name of a kind that has a log, current or removed (an empty
        file is no log: what `slm fsck --repair` leaves of a log whose only line was torn)."""
        folder = self.logs_root / kind
        if not folder.is_dir():
            return []
        out = []
        for entry in sorted(folder.iterdir()):
            name = name_of_file(kind, entry.name)
            if name is not None and entry.is_file() and entry.stat().st_size:
                out.append((name, Reflog(entry, deletions=True)))
        return out

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

    def set_once(self, kind: str, name: str, digest: str) -> bool:
        """Point a name at a digest unless it already points somewhere: the records beside a
        base (SIDE_KINDS) describe the import that brought it, and a later import of the same
        base (the same digest from another path, or a header differing only where the base's
        identity does not look) leaves them as they are, so taking that import back
        (`slm rm`, `slm gc`) leaves the store as it was. Returns whether it was set."""
        if self.get(kind, name) is not None:
            return False
        return self.set(kind, name, digest)

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
            name = None if entry.name.startswith(".") else name_of_file(kind, entry.name)
            if name is None:
                continue  # temp files of an in-flight replace
            try:
                digest = self.get(kind, name)
            except IntegrityError as err:
                out.append((name, None, err))
                continue
            if digest is not None:
                out.append((name, digest, None))
        return out
