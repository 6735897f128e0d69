"""Test hook: a simulated power cut behind the fs layer (SQLite's crash VFS, test6.c, in spirit).

    SLM_FAULTS=powercut@op=N:seed=S:mode=M:root=DIR     cut the power before the Nth fs operation
    SLM_FAULTS=powercut@op=end:seed=S:mode=M:root=DIR   ... right after the command returned

The crash hook (`crash@op=N`) ends the process, but the kernel keeps every byte it was given,
synced or not, so it cannot tell a store that fsyncs from one that never does. This simulator
can. While the session runs it keeps, for everything under DIR (the store's parent, so that
`init` is covered too):

  - per file, its content as of its last fsync (at the start: what is on disk);
  - per directory, its entries as of its last fsync (name -> file or directory);
  - the files freed since (unlinked, renamed over, removed with their tree), as they were;
  - the renames done since (a rename is one change of two entries: both happen or neither).

The fs layer reports every fsync that returned (`fs.sync_observer`); nothing else makes data
durable. At the cut the process stops and DIR is rewritten to a state a kernel could have left
(POSIX semantics, stricter than ext4's): an fsync of a file makes its data durable but not its
name; an fsync of a directory makes its entries durable (not its own name in its parent). Each
unsynced directory change (create, rename, link, unlink, mkdir, rmdir) is kept or dropped, and
each file's unsynced data is dropped, kept or torn at 4 KiB blocks (each block old, new or
garbage; the size old or new), by `mode`:

    drop-all   every unsynced change dropped      keep-all   every one kept (what crash@op does)
    random     each change and each file's data independently: dropped, kept (or torn)
    torn       each change kept or dropped, every file with unsynced data torn

Every choice comes from a generator seeded with (seed, mode, the item's path), so a failing case
replays exactly from the printed spec. Metadata other than names (a file's mode) is kept as it
is at the cut. The writes since a file's last fsync are what differs between its durable and
its current content, compared block by block at the cut.

In-process sessions (tests/durability/durability_matrix.py) may also record, before each operation, the
disk each of several cuts would leave without stopping (`start_recording`), and make one chosen
operation fail with EIO (`eio_on`). A test hook, not a user feature.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

from slm.errors import IOFailure, UsageError
from slm.store.testing.disk_image import Image, Tree, choice_rng, stable_path, torn_data, write_image

MODES = ("drop-all", "keep-all", "random", "torn")
CUT_EXIT_CODE = 86  # the crash hook's code: the process ended without cleaning anything


class PowerCutHappened(BaseException):
    """Raised (in-process sessions) at the cut: a BaseException, so that no `except Exception`
    of the command treats the end of the world as an error it can handle."""


class PowerCut:
    """A power-cut session over `root` (install with faults.install or SLM_FAULTS)."""

    def __init__(self, root: Path, cut_at: int | None, seed: int, mode: str, in_process: bool = True):
        if mode not in MODES:
            raise UsageError(f"unknown power-cut mode {mode!r} (one of {', '.join(MODES)})")
        self.root = Path(root).absolute()
        self.cut_at, self.seed, self.mode, self.in_process = cut_at, seed, mode, in_process
        self.count = 0  # fs operations so far (named points not counted), as FaultPlan counts
        self.image: Image | None = None  # set at the cut
        # Recording (the matrix): instead of stopping, the image every cut in `_cuts` (mode,
        # seed) would leave is computed before each operation and kept: (op index, mode, seed, image).
        self._cuts: list[tuple[str, int]] = []
        self.recorded: list[tuple[int, str, int, Image]] = []
        # (operation, end of its detail): the first such operation fails with EIO (a failure
        # the command sees and undoes; the matrix then checks that the undo is durable too)
        self.eio_on: tuple[str, str] | None = None
        self._uids: dict[int, int] = {}  # inode number -> uid, while the inode lives
        self._next_uid = 0
        self._freed: dict[int, tuple[bytes, int] | dict[str, int]] = {}
        self._renames: list[tuple[tuple[int, str], tuple[int, str]]] = []
        self._read_cache: dict[int, tuple[tuple, bytes]] = {}  # ino -> (size, times), bytes
        self.root_uid = self._uid(os.stat(self.root).st_ino)
        start = self._walk()
        self._durable_dirs: dict[int, dict[str, int]] = {u: dict(v) for u, v in start.dirs.items()}
        self._durable_data: dict[int, bytes] = {u: data for u, (data, _) in start.files.items()}

    @property
    def spec(self) -> str:
        at = "end" if self.cut_at is None else self.cut_at
        return f"powercut@op={at}:seed={self.seed}:mode={self.mode}:root={self.root}"

    @classmethod
    def from_spec(cls, spec: str) -> "PowerCut":
        """Parse `powercut@op=N|end:seed=S:mode=M:root=DIR` (root last: it may hold ':')."""
        head, sep, root = spec.partition(":root=")
        fields = dict(part.partition("=")[::2] for part in head.removeprefix("powercut@").split(":"))
        op, seed, mode = fields.get("op", ""), fields.get("seed", ""), fields.get("mode", "")
        if not sep or not root or not seed.isdigit() or not (op.isdigit() or op == "end"):
            raise UsageError(f"bad SLM_FAULTS={spec!r} (a test hook: "
                             "powercut@op=N|end:seed=S:mode=M:root=DIR)")
        cut = cls(Path(root), None if op == "end" else int(op), int(seed), mode, in_process=False)
        if op == "end":
            import atexit

            atexit.register(cut.cut_now)
        return cut

    # -- what the fs layer tells us ---------------------------------------------------------
    def __call__(self, op: str, detail: str) -> None:
        """The fault hook: called before every fs operation."""
        if self.image is not None:  # the power is already off: nothing more reaches the disk
            raise PowerCutHappened(self.spec)
        if op == "point":
            return
        self.count += 1
        if self.count == self.cut_at:
            self.cut_now()
            return
        if self._cuts:
            self.record_cuts()
        if self.eio_on is not None and op == self.eio_on[0] and detail.endswith(self.eio_on[1]):
            self.eio_on = None
            raise IOFailure(f"cannot {op} {detail}: {os.strerror(errno.EIO)} (injected)")
        if op == "unlink":
            self._forget(Path(detail))
        elif op == "rmtree":
            self._forget_tree(Path(detail))
        elif op == "rename":
            src, dst = (Path(p) for p in detail.split(" -> ", 1))
            self._forget(dst)
            a, b = self._entry(src), self._entry(dst)
            if a and b:
                self._renames.append((a, b))

    def observe_sync(self, fd: int, path: Path) -> None:
        """fs.sync_observer: an fsync of `fd` (opened at `path`) returned."""
        if self.image is not None or not self._inside(path):
            return
        info = os.fstat(fd)
        uid = self._uid(info.st_ino)
        if stat.S_ISDIR(info.st_mode):
            self._durable_dirs[uid] = self._listing(path)
        else:
            self._durable_data[uid] = path.read_bytes()

    # -- the cut -------------------------------------------------------------------------------
    def start_recording(self, cuts: list[tuple[str, int]]) -> None:
        """From the next operation on, record the image of a cut (mode, seed) before each one,
        without stopping: a cut at op N leaves exactly the disk recorded for N, since nothing
        before N depends on whether the power goes at N (tests/durability/test_powercut.py checks it)."""
        for mode, _ in cuts:
            if mode not in MODES:
                raise UsageError(f"unknown power-cut mode {mode!r}")
        self._cuts = list(cuts)

    def record_cuts(self) -> None:
        """Record the image of each cut as of now (also called by a test after the last command:
        the power going right after the command returned)."""
        now = self._walk()
        for mode, seed in self._cuts:
            self.recorded.append((self.count, mode, seed, self._crash_image(now, mode, seed)))

    def cut_now(self) -> None:
        """Cut the power now: compute the disk a kernel could leave; in a subprocess write it
        and exit at once, in-process raise PowerCutHappened (the test then calls write())."""
        if self.image is not None:
            return
        self.image = self._crash_image(self._walk(), self.mode, self.seed)
        if not self.in_process:
            self.write()
            if self.cut_at is not None:
                print(f"slm-fault power cut: SLM_FAULTS={self.spec}", file=sys.stderr, flush=True)
                os._exit(CUT_EXIT_CODE)
            return
        if self.cut_at is not None:
            raise PowerCutHappened(self.spec)

    def write(self) -> None:
        """Rewrite the root to the image of the cut (everything under it is replaced)."""
        if self.image is None:
            raise RuntimeError("power-cut simulator: write() before any cut")  # a test bug
        write_image(self.image, self.root)

    def _crash_image(self, now: Tree, mode: str, seed: int) -> Image:
        def current(uid: int) -> dict[str, int]:
            gone = self._freed.get(uid)
            return now.dirs.get(uid) or (gone if isinstance(gone, dict) else {})

        dir_uids = set(now.dirs) | set(self._durable_dirs) | {u for u, v in self._freed.items()
                                                              if isinstance(v, dict)}
        changes: dict[tuple[int, str], tuple[int | None, int | None]] = {}
        for d in dir_uids:
            old, new = self._durable_dirs.get(d, {}), current(d)
            for name in set(old) | set(new):
                if old.get(name) != new.get(name):
                    changes[(d, name)] = (old.get(name), new.get(name))
        paths = self._paths(now, current)
        keep = self._decide_changes(changes, paths, mode, seed)

        final: dict[int, dict[str, int]] = {}
        for d in dir_uids:
            listing = dict(self._durable_dirs.get(d, {}))
            for (cd, name), (_, new) in changes.items():
                if cd == d and keep[(cd, name)]:
                    if new is None:
                        listing.pop(name, None)
                    else:
                        listing[name] = new
            final[d] = listing

        files: dict[int, tuple[bytes, int]] = {}
        visited: set[int] = set()

        def tree(d: int, where: str) -> dict[str, object]:
            visited.add(d)
            out: dict[str, object] = {}
            for name, uid in sorted(final.get(d, {}).items()):
                path = f"{where}{name}"
                if uid in dir_uids:
                    if uid not in visited:  # a directory reachable twice is shown once
                        out[name] = tree(uid, path + "/")
                    continue
                if uid not in files:
                    files[uid] = self._file_after_cut(uid, now, path, mode, seed)
                out[name] = uid
            return out

        return Image(tree(self.root_uid, ""), files)

    def _decide_changes(self, changes: dict, paths: dict[int, str], mode: str,
                        seed: int) -> dict[tuple[int, str], bool]:
        """Keep (True) or drop each unsynced entry change; a rename's two entries go together."""
        group = {key: key for key in changes}

        def find(key):
            while group[key] != key:
                key = group[key]
            return key
        for a, b in self._renames:
            if a in group and b in group:
                group[find(a)] = find(b)
        decided: dict = {}
        out = {}
        for key in sorted(changes, key=lambda k: (paths.get(k[0], "?"), k[1])):
            head = find(key)
            if head not in decided:
                label = stable_path(f"{paths.get(head[0], '?')}/{head[1]}")
                if mode == "drop-all":
                    decided[head] = False
                elif mode == "keep-all":
                    decided[head] = True
                else:
                    decided[head] = choice_rng(seed, mode, "entry", label).random() < 0.5
            out[key] = decided[head]
        return out

    def _file_after_cut(self, uid: int, now: Tree, path: str, mode: str, seed: int) -> tuple[bytes, int]:
        gone = self._freed.get(uid)
        new, perm = now.files.get(uid) or (gone if isinstance(gone, tuple) else (b"", 0o644))
        old = self._durable_data.get(uid, b"")
        if old == new or mode == "keep-all":
            return new, perm
        if mode == "drop-all":
            return old, perm
        rng = choice_rng(seed, mode, "data", stable_path(path))
        choice = rng.choice(("drop", "keep", "torn")) if mode == "random" else "torn"
        if choice == "drop":
            return old, perm
        if choice == "keep":
            return new, perm
        return torn_data(old, new, rng), perm

    # -- bookkeeping ---------------------------------------------------------------------------
    def _uid(self, ino: int) -> int:
        if ino not in self._uids:
            self._next_uid += 1
            self._uids[ino] = self._next_uid
        return self._uids[ino]

    def _inside(self, path: Path) -> bool:
        path = Path(os.path.abspath(path))
        return path == self.root or self.root in path.parents

    def _entry(self, path: Path) -> tuple[int, str] | None:
        """(uid of the parent directory, name): the directory entry `path` is."""
        if not self._inside(path.parent):
            return None
        try:
            return self._uid(os.stat(path.parent).st_ino), path.name
        except OSError:
            return None

    def _listing(self, path: Path) -> dict[str, int]:
        return {e.name: self._uid(e.inode()) for e in os.scandir(path)}

    def _forget(self, path: Path) -> None:
        """`path` is about to lose its name: if that frees its inode, remember the file as it
        was (a dropped unlink brings it back) and let the inode number be reused."""
        if not self._inside(path):
            return
        try:
            info = os.lstat(path)
        except OSError:
            return
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_ino in self._uids:
            self._freed[self._uids.pop(info.st_ino)] = (path.read_bytes(), stat.S_IMODE(info.st_mode))

    def _forget_tree(self, path: Path) -> None:
        if not self._inside(path) or not path.is_dir() or path.is_symlink():
            return
        found = [(Path(folder), self._listing(Path(folder)), names) for folder, _, names in os.walk(path)]
        for folder, listing, names in found:  # listings first: forgetting frees the uids
            for name in names:
                self._forget(folder / name)
            ino = os.stat(folder).st_ino
            if ino in self._uids:
                self._freed[self._uids.pop(ino)] = listing

    def _walk(self) -> Tree:
        tree = Tree()
        for folder, subdirs, names in os.walk(self.root):
            listing: dict[str, int] = {}
            for name in subdirs + names:
                path = Path(folder, name)
                info = os.lstat(path)
                uid = self._uid(info.st_ino)
                listing[name] = uid
                if stat.S_ISREG(info.st_mode):
                    tree.files[uid] = (self._read(path, info), stat.S_IMODE(info.st_mode))
            tree.dirs[self._uid(os.stat(folder).st_ino)] = listing
        return tree

    def _read(self, path: Path, info: os.stat_result) -> bytes:
        """A file's bytes; unchanged files (same inode, size and times) are not read again, so
        the images of many cuts share one copy of each blob."""
        version = (info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        cached = self._read_cache.get(info.st_ino)
        if cached is None or cached[0] != version:
            cached = (version, path.read_bytes())
            self._read_cache[info.st_ino] = cached
        return cached[1]

    def _paths(self, now: Tree, current) -> dict[int, str]:
        """A stable path for every directory uid (as it is now, else as it was durably)."""
        out = {self.root_uid: ""}
        for listings in (lambda d: current(d), lambda d: self._durable_dirs.get(d, {})):
            todo = [self.root_uid]
            while todo:
                d = todo.pop()
                for name, uid in sorted(listings(d).items()):
                    if uid not in out and (uid in now.dirs or uid in self._durable_dirs):
                        out[uid] = f"{out[d]}/{name}"
                        todo.append(uid)
        return out


__all__ = ["CUT_EXIT_CODE", "MODES", "Image", "PowerCut", "PowerCutHappened", "write_image"]
