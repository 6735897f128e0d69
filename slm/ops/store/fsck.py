"""`slm fsck [--repair]`: check every invariant of the store; with --repair, restore the last
consistent state and say exactly what was done.

Recovery rule: the reflog is the commit record. A transaction is committed once its reflog
line is durable (everything it names was made durable before that line). So after a crash:
    torn last reflog line            -> truncated (that transaction never committed)
    damaged line before the last     -> the reflog is rebuilt from its intact lines (the chain
                                        of old -> new ids restores a lost transition's ids)
    refs/active != last reflog entry -> refs/active := last entry (roll forward)
    a name's torn last log line      -> truncated
    an intent in journal/            -> its transaction finished or undone as its kind decides
                                        (slm.ops.store.transaction_kinds: a switch, an import,
                                        a name move, a receive, a gc), then the intent ended
    a damaged intent                 -> removed; one of a kind this slm does not know is
                                        reported and left for the operator
A store file that is not a regular file (a FIFO, a directory, a link where a ref or the reflog
belongs) is never opened for reading: it is moved to lost+found/ and rebuilt.
A blob whose bytes do not match its name cannot be repaired from inside the store: it is moved
to lost+found/ so that re-importing the original file can store it again.

The checks run in `Fsck.run`, one method each, every finding through `Fsck.add`.
"""

from __future__ import annotations

import stat
from pathlib import Path

from slm.compose.adapter_manifest import parse_adapter_manifest
from slm.compose.base_manifest import parse_base_manifest
from slm.errors import SlmError
from slm.formats.base_origin import parse_origin_record
from slm.formats.gguf_frame import parse_frame_record
from slm.ops.infer import compositions
from slm.ops.store import fsck_follow, fsck_names, naming
from slm.ops.store.transaction_kinds import RECOVER
from slm.ops.progress import NoProgress, Progress
from slm.ops.results import Finding, FsckReport
from slm.store import StoreDir
from slm.store import digest as dg
from slm.store import fs
from slm.store.config import lock_timeout, read_config
from slm.store.lock import DEFAULT_TIMEOUT_S
from slm.store.names import NAMED_KINDS, SIDE_KINDS
from slm.store.objects import BLOB_MODE, staging_in_use
from slm.store.reflog import Entry
from slm.store.transaction import Seen, end_interrupted


class Fsck:
    def __init__(self, store: StoreDir, repair: bool, progress: Progress):
        self.store, self.repair, self.progress = store, repair, progress
        self.findings: list[Finding] = []
        self.corrupt: set[str] = set()
        self.blobs = 0
        self.bytes = 0
        self._name_cache: dict[str, list[tuple[str, str]]] = {}

    def add(self, problem: str, what: str, action: str = "", fix=None, repairable: bool = True) -> None:
        repaired = False
        if self.repair and fix is not None:
            fix()
            repaired = True
        self.findings.append(Finding(problem, what, action, repaired, repairable and fix is not None))

    # -- files ---------------------------------------------------------------------------
    def check_config(self) -> None:
        """A config.toml that cannot be read, or holds an unknown or misplaced key, is reported
        with what to do about it. Not repaired: the settings it held (the signing policy among
        them) are recorded nowhere else, and a default config.toml would turn the policy off."""
        try:
            read_config(self.store.root)
        except SlmError as err:
            self.add("bad-config", str(err), repairable=False)

    def check_junk(self) -> None:
        root = self.store.root
        for entry in sorted((root / "tmp").iterdir()):
            if entry.is_dir() and staging_in_use(entry):
                continue  # an import filling it right now (it stages without the store lock)
            self.add("junk", f"tmp/{entry.name} left by an interrupted command", "remove it",
                     lambda e=entry: fs.remove_tree(e) if e.is_dir() else fs.unlink(e))
        for folder in [root / "refs", root / "logs", root / "journal", root / "follow", *(root / "names").glob("*"),
                       *(root / "logs" / "names").glob("*")]:
            for entry in sorted(folder.glob(".*.tmp")):
                self.add("junk", f"{entry.relative_to(root)}: a temp file of an interrupted write",
                         "remove it", lambda e=entry: fs.unlink(e))

    def check_blobs(self) -> None:
        objects = self.store.objects
        digests = sorted(objects.digests())
        self.progress.start("re-hashing blobs", sum(objects.path(d).lstat().st_size for d in digests))
        for digest in digests:
            path = objects.path(digest)
            info = path.lstat()
            self.blobs += 1
            self.bytes += info.st_size
            if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
                self.corrupt.add(digest)
                self.add("symlink", f"objects/blake3/{path.name} is not a regular file",
                         "move it to lost+found/", lambda p=path: self._quarantine(p))
            elif objects.hash_file(digest) != digest:
                self.corrupt.add(digest)
                self.add("corrupt-blob", f"blob {dg.short(digest)}: its bytes do not hash to its name",
                         "move it to lost+found/ (re-import the original to restore it)",
                         lambda p=path: self._quarantine(p))
            elif stat.S_IMODE(info.st_mode) != BLOB_MODE:
                self.add("blob-mode", f"blob {dg.short(digest)} is writable "
                         f"(mode {stat.S_IMODE(info.st_mode):o})", "make it read-only (0444)",
                         lambda p=path: fs.chmod(p, BLOB_MODE))
            self.progress.advance(info.st_size)
        self.progress.finish()
        # every blob re-hashed: the verified-digest cache keeps exactly the ones that matched
        objects.verified.retain(set(digests) - self.corrupt)
        objects.save_verified()

    def _quarantine(self, path: Path) -> None:
        lost = self.store.root / "lost+found"
        fs.mkdir(lost)
        target = lost / path.name
        if target.exists() or target.is_symlink():
            target = fs.temp_name(lost, path.name)
        fs.rename(path, target)
        fs.fsync_dir(lost)  # the new name first: a cut between the two fsyncs keeps both names
        fs.fsync_dir(path.parent)

    def _set_aside_damaged(self, path: Path) -> None:
        """Move a store file that is not a regular file out of the way before rebuilding it."""
        if path.is_symlink() or (path.exists() and not path.is_file()):
            self._quarantine(path)

    def _blob_ok(self, digest: str) -> bool:
        return digest not in self.corrupt and self.store.objects.has(digest)

    # -- manifests and names ------------------------------------------------------------------
    def check_names(self) -> None:
        parsers = {"bases": self._base_blobs, "adapters": self._adapter_blobs}
        for kind, blobs_of in parsers.items():
            for name, digest in self._names(kind):
                self._check_manifest(f"{kind[:-1]} {name}", digest, blobs_of)
        for hex_id, digest in self._names("compositions"):
            self._check_composition(dg.PREFIX + hex_id)
        known = {dg.PREFIX + h for h, _ in self._names("compositions")}
        for kind in ("tags", "remotes"):
            for name, comp_id in self._names(kind):
                if comp_id not in known:
                    self.add("unknown-composition", f"{naming.KIND_LABEL[kind]} {name!r} names "
                             f"{dg.short(comp_id)}, which the store does not have", repairable=False)
        for kind in NAMED_KINDS:
            for name, log in self.store.names.logged(kind):
                self._check_name_log(kind, name, log)

    def _check_name_log(self, kind: str, name: str, log) -> None:
        label = f"the log of {naming.KIND_LABEL[kind]} {name!r}"
        try:
            state = log.read()
        except SlmError as err:
            salvaged = log.salvage() if log.path.is_file() else []

            def rebuild():
                self._quarantine(log.path)
                log.rewrite(salvaged)
            self.add("damaged-reflog", f"{label}: {err}", "rebuild it from its intact lines", rebuild)
            return
        if state.torn_tail:
            # a log whose only line was torn is left empty: an empty log is no log (Names.logged)
            self.add("torn-reflog", f"{label} ends with {len(state.torn_tail)} bytes of a torn line",
                     "truncate the torn line", lambda: fs.truncate(log.path, state.intact_size))

    def check_side_records(self) -> None:
        """The records beside a base (slm.store.names.SIDE_KINDS: its GGUF frame, its origin):
        provenance, not identity, so a damaged or dangling one is repaired by removing it (`slm
        export --format gguf` of that base is then refused until its GGUF file is imported again;
        a PEFT export names no base_model_name_or_path)."""
        for kind in SIDE_KINDS:
            for hex_id, digest, error in self.store.names.scan(kind):
                problem = str(error) if error is not None else self._side_problem(kind, digest)
                if problem:
                    self.add("bad-side-record", f"names/{kind}/{hex_id[:12]}: {problem}", "remove it",
                             lambda kind=kind, hex_id=hex_id: self.store.names.remove(kind, hex_id))

    def _side_problem(self, kind: str, digest: str) -> str:
        if not self._blob_ok(digest):
            return f"record {dg.short(digest)} is missing or corrupt"
        try:
            data = self.store.objects.read_verified(digest)
            if kind == "gguf":
                header = parse_frame_record(data, "gguf frame record")[0]
                if not self._blob_ok(header):
                    return f"header {dg.short(header)} is missing or corrupt"
            else:
                parse_origin_record(data, "base origin record")
        except SlmError as err:
            return str(err)
        return ""

    def _names(self, kind: str) -> list[tuple[str, str]]:
        """The intact names of a kind; each damaged name file is a finding (once per run)."""
        if kind not in self._name_cache:
            good = []
            for name, digest, error in self.store.names.scan(kind):
                if error is None:
                    good.append((name, digest))
                else:
                    self.add("bad-name", str(error), repairable=False)
            self._name_cache[kind] = good
        return self._name_cache[kind]

    def _check_manifest(self, label: str, digest: str, blobs_of) -> list[str]:
        if not self._blob_ok(digest):
            self.add("missing-manifest", f"{label}: manifest {dg.short(digest)} is missing or corrupt",
                     repairable=False)
            return []
        try:
            blobs = blobs_of(self.store.objects.read_verified(digest))
        except SlmError as err:
            self.add("bad-manifest", f"{label}: {err}", repairable=False)
            return []
        missing = [d for d in blobs if not self._blob_ok(d)]
        if missing:
            self.add("missing-blob", f"{label}: {len(missing)} blob(s) missing or corrupt, "
                     f"e.g. {dg.short(missing[0])}", repairable=False)
        return blobs

    @staticmethod
    def _base_blobs(data: bytes) -> list[str]:
        return parse_base_manifest(data).blob_digests()

    @staticmethod
    def _adapter_blobs(data: bytes) -> list[str]:
        return parse_adapter_manifest(data).blob_digests()

    def _check_composition(self, comp_id: str) -> bool:
        label = f"composition {dg.short(comp_id)}"
        try:
            comp = compositions.load(self.store, comp_id)
        except SlmError as err:
            self.add("bad-composition", f"{label}: {err}", repairable=False)
            return False
        ok = bool(self._check_manifest(f"{label} base", comp.base, self._base_blobs))
        for a in comp.adapters:
            ok &= bool(self._check_manifest(f"{label} adapter {a.name}", a.digest, self._adapter_blobs))
        missing = [(kind, d) for kind, listed in (("signature", comp.signatures), ("certificate", comp.certificates))
                   for d in listed if not self._blob_ok(d)]
        if missing:
            kind, digest = missing[0]
            self.add("missing-blob", f"{label}: {kind} blob {dg.short(digest)} is missing or corrupt",
                     repairable=False)
        return ok and not missing

    # -- refs/active, reflog, journal -----------------------------------------------------
    def _read_reflog(self):
        """The reflog's intact lines; a damaged one (or a reflog that is not a regular file) is
        a finding whose repair rebuilds the log, and the rebuilt entries are checked on."""
        store = self.store
        try:
            log = store.reflog.read()
        except SlmError as err:
            try:
                salvaged = store.reflog.salvage()
            except SlmError:  # not a regular file: nothing to salvage
                salvaged = []

            def rebuild():  # the damaged log is kept in lost+found/ for the operator
                self._quarantine(store.reflog.path)
                store.reflog.rewrite(salvaged)
            self.add("damaged-reflog", str(err), "rebuild the reflog from its intact lines "
                     "(a lost line's ids restored from its neighbours)", rebuild)
            return salvaged, b"", 0
        if log.torn_tail:
            self.add("torn-reflog", f"logs/active ends with {len(log.torn_tail)} bytes of a torn line",
                     "truncate the torn line", lambda: fs.truncate(store.reflog.path, log.intact_size))
        return log.entries, log.torn_tail, log.intact_size

    def check_transitions(self) -> list[Entry]:
        """refs/active against the reflog; the committed transitions, for the journal's check."""
        store = self.store
        entries, _, _ = self._read_reflog()
        known = {dg.PREFIX + h for h, _ in self._names("compositions")}
        for e in entries:
            for comp_id in filter(None, (e.old, e.new)):
                if comp_id not in known:
                    self.add("unknown-composition", f"reflog entry {e.seq} names {dg.short(comp_id)}, "
                             "which the store does not have", repairable=False)
        committed = entries[-1].new if entries else None
        try:
            ref = store.active_ref.read()
            ref_damaged = False
        except SlmError:
            ref, ref_damaged = None, True
        if ref_damaged or ref != committed:
            ref_short, committed_short = dg.short_pair(ref or "", committed or "")
            state = "damaged" if ref_damaged else (ref_short if ref else "absent")
            path = store.active_ref.path
            if committed is None:
                self.add("ref-mismatch", f"refs/active is {state} but the reflog is empty",
                         "remove refs/active", lambda: fs.remove_any(path))
            else:
                def set_ref():
                    self._set_aside_damaged(path)
                    store.active_ref.write(committed)
                self.add("ref-mismatch", f"refs/active is {state}; the last committed transition "
                         f"made {committed_short} active", f"set refs/active to {committed_short}",
                         set_ref)
        return entries

    def check_journal(self, transitions: list[Entry]) -> None:
        """Each interrupted transaction, as its kind decides (slm.ops.store.transaction_kinds):
        finished or undone, then its intent ended through the journal."""
        seen = Seen(transitions, self._blob_ok)
        for intent in self.store.journal.pending():
            if isinstance(intent, Path):
                self.add("interrupted", f"journal/{intent.name}: a damaged intent record",
                         "remove it (refs/active follows the reflog)",
                         lambda i=intent: end_interrupted(self.store.journal, i))
                continue
            recover = RECOVER.get(intent.kind)
            if recover is None:
                self.add("unknown-intent", f"journal/{intent.name}.intent: an interrupted {intent.op} of a kind "
                         f"this slm does not know ({intent.kind!r}); a newer slm may recover it, else remove "
                         "the file by hand", repairable=False)
                continue
            decision = recover(self.store, intent, seen)
            self.add("interrupted", decision.what, decision.action,
                     lambda i=intent, d=decision: end_interrupted(self.store.journal, i, d.step))

    def check_prompt_cache(self) -> None:
        """Prompt-cache entries whose content no longer hashes to the digest they were written
        with (slm.ops.infer.prefix_cache): derived data, removed by --repair."""
        from slm.ops.infer.prefix_cache import damaged_entries

        root = self.store.root
        for path, why in damaged_entries(root / "cache")[1]:
            self.add("damaged-cache-entry", f"{path.relative_to(root)}: a prompt-cache entry: {why}",
                     "remove it (a cache: the prompt is computed again)", lambda p=path: fs.unlink(p))

    def run(self) -> FsckReport:
        self.check_config()
        self.check_junk()
        self.check_blobs()
        self.check_names()
        self.check_side_records()
        self.check_journal(self.check_transitions())
        self.check_prompt_cache()
        fsck_names.check_names(self.store, self.add, self.repair)
        if self.repair or not self.store.journal.pending():
            fsck_follow.check_follow(self.store, self.add)
        unresolved = [f for f in self.findings if not f.repaired]
        return FsckReport(not self.findings, self.repair, self.blobs, self.bytes, tuple(self.findings),
                          len(unresolved))


def fsck(store: StoreDir, repair: bool = False, progress: Progress | None = None) -> FsckReport:
    checker = Fsck(store, repair, progress or NoProgress())
    if not repair:
        return checker.run()
    with store.locked(_lock_timeout(store)):
        return checker.run()


def _lock_timeout(store: StoreDir) -> float:
    try:
        return lock_timeout(store.config)
    except SlmError:  # a damaged config.toml is one of the findings, not a reason not to repair the rest
        return DEFAULT_TIMEOUT_S
