"""The .slm/ store: where it is, how it is laid out, and how it is created.

    .slm/
      config.toml            format version, defaults
      objects/blake3/<hex>   immutable blobs (mode 0444)
      names/<kind>/<name>    human names -> digests
      refs/active            the active composition id
      logs/active            reflog, one checksummed line per transition
      journal/               intent records of in-flight transactions
      cache/                 derived data (prefix cache by composition id, verified-digests); safe to delete
      tmp/                   staging; what a crash leaves is junk, but a pull's pull-<hex>/ (resumable)
      lock                   held by the one writer
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator

from slm.errors import InvalidInput, NotFound, SlmError
from slm.store import fs
from slm.store.config import check_format, default_config, lock_timeout, parse_config, read_config
from slm.store.journal import Journal
from slm.store.lock import store_lock
from slm.store.names import Names
from slm.store.objects import ObjectStore
from slm.store.reflog import Reflog
from slm.store.refs import Ref
from slm.store.transaction import Transaction
from slm.store.verified import FILE_NAME as VERIFIED_FILE
from slm.store.verified import VerifiedCache

STORE_DIRNAME = ".slm"
ENV_STORE = "SLM_STORE"
SUBDIRS = ("objects", "names", "refs", "logs", "journal", "cache", "tmp")


@dataclass
class StoreDir:
    """One .slm/ directory and its parts (blobs, names, refs, reflog, journal, lock); the
    public API's slm.Store wraps one."""

    root: Path

    @cached_property
    def objects(self) -> ObjectStore:
        """The blobs, with the one verified-digest cache of this StoreDir object (what re-hashes
        learn during a command is saved once, by the command)."""
        return ObjectStore(self.root / "objects", self.root / "tmp",
                           VerifiedCache(self.root / "cache" / VERIFIED_FILE))

    @property
    def names(self) -> Names:
        return Names(self.root / "names")

    @property
    def active_ref(self) -> Ref:
        return Ref(self.root / "refs" / "active")

    @property
    def reflog(self) -> Reflog:
        return Reflog(self.root / "logs" / "active")

    @property
    def journal(self) -> Journal:
        return Journal(self.root / "journal")

    def transaction(self, name: str, op: str, new: str, *, old: str | None = None, created: bool = False,
                    done: str = "", journaled: bool = True, undoable: bool = True) -> Transaction:
        """A transaction journaled as journal/<name>.intent "<op> <old> <new>" (slm.store.transaction:
        the intent, the commit point, undo before it, CommittedIncomplete after it). `done` says
        what a committed transaction made ("adapter 'x' is imported") in the exit-13 message."""
        return Transaction(self.journal, name, op, new, old=old, created=created, done=done,
                           journaled=journaled, undoable=undoable)

    @property
    def config(self) -> dict:
        """config.toml, read and checked afresh (slm.store.config: unknown keys are refused)."""
        return read_config(self.root)

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    @contextmanager
    def locked(self, timeout: float | None = None) -> Iterator["StoreDir"]:
        if timeout is None:
            timeout = lock_timeout(self.config)
        with store_lock(self.root / "lock", timeout):
            yield self

    @classmethod
    def open(cls, root: Path, check_config: bool = True) -> "StoreDir":
        """The store at `root`. check_config=False only for fsck, which reports a damaged or
        invalid config.toml as a finding instead of refusing to look at the rest."""
        root = Path(root)
        config = root / "config.toml"
        if not (config.exists() or config.is_symlink()):
            raise NotFound(f"{root} is not an slm store (no config.toml); run `slm init`")
        if root.is_symlink():
            raise InvalidInput(f"{root} is a symlink; the store refuses links")
        if check_config:
            read_config(root)  # fail early on an unsupported format, an unknown or misplaced key
            return cls(root)
        try:
            data = parse_config(root)
        except SlmError:
            return cls(root)  # damaged: fsck reports it as a finding
        check_format(data, root)  # readable, of another format: even fsck must not touch it
        return cls(root)


def init_store(root: Path) -> tuple[StoreDir, bool]:
    """Create a store at `root` (idempotent). Returns (store, created)."""
    root = Path(root).absolute()
    if (root / "config.toml").is_file():
        return StoreDir.open(root), False
    if root.exists() and not root.is_dir():
        raise InvalidInput(f"{root} exists and is not a directory")
    for folder in reversed((root, *root.parents)):  # like `git init`, create missing parents
        if folder.exists() and not folder.is_dir():
            raise InvalidInput(f"{folder} exists and is not a directory")
        fs.mkdir(folder)
    for sub in SUBDIRS:
        fs.mkdir(root / sub, sync_parent=False)
    # the writers' lock file lives for the store's life; its atomic_replace ends with an fsync
    # of root, which also makes the subdirectories' entries durable before config.toml exists
    fs.atomic_replace(root / "lock", b"")
    # config.toml last: its presence is what makes the directory a store.
    import tomlkit

    fs.atomic_replace(root / "config.toml", tomlkit.dumps(default_config()).encode("utf-8"))
    return StoreDir(root), True


def find_store(explicit: str | os.PathLike | None = None, cwd: Path | None = None) -> Path:
    """--store DIR, else $SLM_STORE, else .slm searched upward from the working directory."""
    if explicit:
        return Path(explicit).absolute()
    env = os.environ.get(ENV_STORE)
    if env:
        return Path(env).absolute()
    here = (cwd or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        candidate = folder / STORE_DIRNAME
        if (candidate / "config.toml").is_file():
            return candidate
    raise NotFound(
        f"no slm store found in {here} or its parents; run `slm init`, "
        f"or name one with --store or {ENV_STORE}"
    )


def default_init_path(explicit: str | os.PathLike | None = None) -> Path:
    """Where `slm init` creates a store: --store, else $SLM_STORE, else ./.slm."""
    if explicit:
        return Path(explicit).absolute()
    env = os.environ.get(ENV_STORE)
    return Path(env).absolute() if env else Path.cwd() / STORE_DIRNAME
