"""The one guarded path for every file slm writes where a user asks: `slm export -o` (an OCI
layout directory or tar, a GGUF LoRA, a PEFT directory), `slm run --logits-out`, `slm verify
--certificate`.

Every such output:

  - is refused inside the store (InvalidInput, exit 4) before anything is written: the target's
    real path (every symlink resolved) and each of its existing ancestors are compared with the
    store root, by path and by inode (a bind mount or another spelling of the store is caught);
  - is built under a fresh hidden name beside the target (`.NAME.PID.RANDOM.tmp`, created with
    O_CREAT | O_EXCL | O_NOFOLLOW, or mkdir: never a file or link someone planted), written,
    fsynced, then renamed into place and the directory fsynced: a name that shows the output
    shows all of it, before and after a crash or a power cut;
  - refuses an existing target (InvalidInput, exit 4), and the final rename does not replace a
    name that appeared meanwhile (renameat2 RENAME_NOREPLACE); `--logits-out` alone replaces an
    existing regular file (documented), the file a symlink there names;
  - on any failure (exit 12 for the OS refusing a write: disk full, EFBIG under `ulimit -f`,
    EIO), or an interrupt, removes its own temporary and nothing else.

Everything goes through slm.store.fs, so the fault hooks and the power-cut simulator see these
writes as they see the store's (tests/durability/test_durability.py has a case per output kind).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from slm.errors import InvalidInput, IOFailure
from slm.store import fs

WRITE_CHUNK = 1 << 20  # small writes (a tar's headers) are gathered into writes of this size


def check_outside_store(target: Path, store_root: Path, what: str) -> Path:
    """The real path `target` names (symlinks resolved, the last one too); InvalidInput if it
    is the store or inside it."""
    real = Path(os.path.realpath(target))
    store_real = Path(os.path.realpath(store_root))
    inside = real == store_real or store_real in real.parents
    try:
        store_id = os.stat(store_real)
    except OSError:
        store_id = None
    for place in (real, *real.parents):
        if inside or store_id is None:
            break
        try:
            info = os.stat(place)
        except OSError:
            continue
        inside = (info.st_dev, info.st_ino) == (store_id.st_dev, store_id.st_ino)
    if inside:
        raise InvalidInput(f"{what} {target}: refusing to write inside the store ({store_root})")
    return real


def _cannot_write(target: Path, err: IOFailure) -> IOFailure:
    cause = err.__cause__
    reason = os.strerror(cause.errno) if isinstance(cause, OSError) and cause.errno else str(err)
    return IOFailure(f"cannot write {target}: {reason}")


def _exists_error(target: Path) -> InvalidInput:
    return InvalidInput(f"{target} already exists; choose a new path")


class _Output:
    """What a file and a directory output share: the checks, the temporary's life, the commit."""

    def __init__(self, target: Path, store_root: Path, what: str, replace: bool):
        self.shown = Path(target)
        real = check_outside_store(self.shown, store_root, what)
        if not replace and os.path.lexists(self.shown):
            raise _exists_error(self.shown)
        if replace and os.path.lexists(real) and not real.is_file():
            raise IOFailure(f"cannot write {self.shown}: not a regular file")
        self.target, self.replace = real, replace
        self.tmp = fs.temp_name(real.parent, real.name)
        self.committed = False
        self._created = False  # set once the temporary exists: only then is it ours to remove

    def _place(self) -> None:
        """Rename the finished temporary into place and make the name durable."""
        try:
            fs.rename(self.tmp, self.target, replace=self.replace)
        except FileExistsError as err:
            raise _exists_error(self.shown) from err
        except IOFailure as err:
            raise _cannot_write(self.shown, err) from err
        self._created = False  # the temporary's name is gone: it is the output now
        try:
            fs.fsync_dir(self.target.parent)
        except IOFailure as err:
            if not self.replace:  # the name is ours alone: taken back, not left half durable
                try:
                    fs.remove_any(self.target)
                except IOFailure:
                    pass  # the disk refuses even that: the first error is the one to report
            raise _cannot_write(self.shown, err) from err
        self.committed = True

    def discard(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            self.discard()


class OutputFile(_Output):
    """One file: `write` (and `tell`, for tarfile and np.save) into the temporary, `commit`."""

    def __init__(self, target: Path, store_root: Path, what: str, replace: bool = False):
        super().__init__(target, store_root, what, replace)
        try:
            self._file = fs.NewFile(self.tmp)
        except IOFailure as err:
            raise _cannot_write(self.shown, err) from err
        self._created = True
        self._pending: list[bytes] = []
        self._pending_size = 0

    def write(self, data) -> int:
        data = bytes(data)
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= WRITE_CHUNK:
            self._flush()
        return len(data)

    def tell(self) -> int:
        return self._file.size + self._pending_size

    def _flush(self) -> None:
        if self._pending:
            data, self._pending, self._pending_size = b"".join(self._pending), [], 0
            try:
                self._file.write(data)
            except IOFailure as err:
                raise _cannot_write(self.shown, err) from err

    def commit(self) -> Path:
        self._flush()
        try:
            self._file.sync_and_close()
        except IOFailure as err:
            raise _cannot_write(self.shown, err) from err
        self._place()
        return self.target

    def discard(self) -> None:
        self._file._close()
        if self._created:
            self._created = False
            fs.unlink(self.tmp)


class OutputDirectory(_Output):
    """A directory of files, built in a temporary directory and renamed into place whole."""

    def __init__(self, target: Path, store_root: Path, what: str):
        super().__init__(target, store_root, what, replace=False)
        self._dirs: list[Path] = []
        self._make(self.tmp)
        self._created = True

    def _make(self, path: Path) -> None:
        try:
            made = fs.mkdir(path, sync_parent=False)
        except IOFailure as err:
            raise _cannot_write(self.shown, err) from err
        if not made:  # fs.mkdir adopts what exists; an output never does
            raise IOFailure(f"cannot write {self.shown}: {path.name} appeared while it was being written")
        self._dirs.append(path)

    def subdirectory(self, relative: str) -> None:
        self._make(self.tmp / relative)

    def write_file(self, relative: str, write: Callable[[fs.NewFile], None]) -> None:
        """A new file in the output, written by `write(f)` (f.write(bytes)), then fsynced."""
        try:
            with fs.NewFile(self.tmp / relative) as f:
                write(f)
                f.sync_and_close()
        except IOFailure as err:
            raise _cannot_write(self.shown, err) from err

    def commit(self) -> Path:
        try:
            for path in reversed(self._dirs):  # each directory's entries durable before the rename
                fs.fsync_dir(path)
        except IOFailure as err:
            raise _cannot_write(self.shown, err) from err
        self._place()
        return self.target

    def discard(self) -> None:
        if self._created:
            self._created = False
            fs.remove_tree(self.tmp)
