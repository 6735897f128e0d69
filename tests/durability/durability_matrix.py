"""The power-cut matrix (docs/recovery.md): every fs operation of every verb, every cut mode.

One scenario = a store, a committed command A (exit 0: acknowledged) and the command B under
test, both run in-process under one power-cut session (slm/store/testing/powercut.py), so that what A
left unsynced is still at risk while B runs. The session records, before each of B's
operations and once after B returned, the disk each cut (mode, seed) would leave. Each
distinct disk is then written to a fresh directory and recovered with `slm fsck --repair`,
and these must hold:

  - before the repair, every blob's bytes hash to its name (blobs are fsynced before linking);
  - `fsck --repair` exits 0 and a second `fsck` is clean;
  - refs/active names a composition that was active before or after B, and the reflog is the
    one after A or that plus B's line (A's transition, acknowledged, is never lost);
  - no name that the stores before and after B both have is lost or changed, and no name
    that neither has appears (B's own name change is all or nothing);
  - a cut after B returned leaves exactly the state after B (B was acknowledged);
  - the recovered composition activates again (a switch away and back, every blob re-hashed).

Used by tests/durability/test_durability.py (in `make test`: one seed) and scripts/mutate_fsync.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from slm.cli import run as slm_run
from slm.store import StoreDir
from slm.store.testing import faults
from slm.store import digest as dg
from slm.store.names import NAMED_KINDS
from slm.store.testing.disk_image import Image, write_image
from slm.store.testing.powercut import PowerCut, PowerCutHappened

FIXED_TIME = 1_800_000_000.0  # the clock every matrix run sees: replays are byte for byte


@dataclass(frozen=True)
class Scenario:
    name: str
    committed: tuple[tuple[str, ...], ...]  # A: commands that exit 0 before the cut one
    cut: tuple[str, ...]  # B: the command whose every operation gets a power cut
    prepare: str = "template"  # "template" (a copy of it), "empty" (no store yet), or a key of t
    quarantine: bool = False  # B moves a corrupt blob to lost+found/: it must never be lost
    eio_on: tuple[str, str] | None = None  # B's first such fs operation fails (op, end of detail)


def scenarios(t: dict) -> list[Scenario]:
    lora4, hf = str(t["root"] / "lora4"), str(t["tiny"]["hf"])
    gguf = str(t["tiny"]["gguf_q"])
    return [
        Scenario("init", (), ("init",), prepare="empty"),
        Scenario("import-base-fresh", (("init",),), ("import", "base", gguf, "--name", "tq"), prepare="empty"),
        Scenario("import-base", (("activate", "tf"),), ("import", "base", hf, "--name", "th", "--quant", "q4_0")),
        Scenario("import-adapter", (("activate", "tf"),), ("import", "adapter", lora4, "--name", "a4")),
        Scenario("activate", (("activate", "tf"),), ("activate", "tq", "a1", "a2@0.5")),
        Scenario("activate-first", (("init",), ("import", "base", gguf, "--name", "tq"),
                                    ("import", "base", str(t["tiny"]["gguf"]), "--name", "tf")),
                 ("activate", "tq"), prepare="empty"),
        Scenario("activate-eio", (("activate", "tf"),), ("activate", "tq", "a2"),
                 eio_on=("fsync", "logs/active")),
        Scenario("deactivate", (("activate", "tq", "a1", "a2@0.5"),), ("deactivate", "a1")),
        Scenario("rollback", (("activate", "tf"),), ("rollback",)),
        Scenario("gc", (("activate", "tf"),), ("gc",)),
        Scenario("fsck-repair-finish", (), ("fsck", "--repair"), prepare="interrupted-after-commit"),
        Scenario("fsck-repair-undo", (), ("fsck", "--repair"), prepare="interrupted-before-commit"),
        Scenario("fsck-repair-quarantine", (), ("fsck", "--repair"), prepare="corrupt-orphan", quarantine=True),
        Scenario("fsck-repair-torn", (), ("fsck", "--repair"), prepare="torn-reflog"),
        # names are refs with a history: each move is a transaction whose commit point is the
        # name's reflog line (slm.ops.store.naming)
        Scenario("import-adapter-move", (("activate", "tf"),), ("import", "adapter", lora4, "--name", "a1")),
        Scenario("tag", (("activate", "tf"),), ("tag", "t1", "tq+a1@0.5+a2")),
        Scenario("tag-move", (("tag", "t1", "tq"),), ("tag", "t1", "tf+a2")),
        Scenario("rm", (("tag", "t1", "tq+a2"),), ("rm", "--force", "a2")),  # t1 uses a2
        Scenario("mv", (("activate", "tf"),), ("mv", "a2", "b2")),
        Scenario("gc-prune-now", (("rm", "a2"),), ("gc", "--prune-now")),
        # gc's retention of logs/active: the reflog rewritten to its newest line (one atomic
        # replace), then what only the dropped lines reached removed (tq+a1, tq+a2, a2's blobs)
        Scenario("gc-retention", (("activate", "tq", "a2"), ("activate", "tf"), ("activate", "tq"), ("rm", "a2")),
                 ("gc", "--prune-now", "--keep-active", "1", "--expire-active", "now")),
    ]


def cli(store: Path, *args: str) -> int:
    return slm_run(["--store", str(store), *args])


def build_template(root: Path, tiny: dict) -> dict:
    """Two bases, two adapters, three transitions, an orphan adapter for gc; and the two
    interrupted stores the fsck scenarios start from (made by a real crash in a child)."""
    import make_random_lora

    from helpers import forget_name, tiny_store

    store = tiny_store(root, tiny, {"a1": 1, "a2": 2, "a3": 3},
                       [("activate", "tf"), ("activate", "tq"), ("activate", "tq", "a1")],
                       bases={"tq": "gguf_q", "tf": "gguf"}, store=root / "template" / "store")
    # never imported here: the import-adapter scenario does
    make_random_lora.make_random_lora(root / "lora4", rank=4, seed=4, hidden=64, intermediate=128, layers=2, kv_dim=32)
    orphan = StoreDir.open(store).names.resolve("adapters", "a3")
    forget_name(store, "adapters", "a3")  # its blobs: only gc reaches them
    assert cli(store, "fsck") == 0
    out = {"root": root, "tiny": tiny, "template": store}
    # a corrupt blob that nothing references: fsck --repair moves it to lost+found/
    corrupt = root / "corrupt-orphan" / "store"
    shutil.copytree(store, corrupt, symlinks=True)
    blob = StoreDir.open(corrupt).objects.path(orphan)
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    blob.chmod(0o444)
    assert cli(corrupt, "fsck") == 5
    out["corrupt-orphan"], out["corrupt-bytes"] = corrupt, bytes(data)
    # a reflog whose last line was torn by a crash: fsck --repair truncates it
    torn = root / "torn-reflog" / "store"
    shutil.copytree(store, torn, symlinks=True)
    with open(torn / "logs" / "active", "ab") as log:
        log.write(b"4 blake3:0123")
    assert cli(torn, "fsck") == 9
    out["torn-reflog"] = torn
    for kind, point in (("after-commit", "reflog.after-append"), ("before-commit", "reflog.before-append")):
        copy = root / f"interrupted-{kind}" / "store"
        shutil.copytree(store, copy, symlinks=True)
        r = subprocess.run([sys.executable, "-m", "slm", "--store", str(copy), "activate", "tq", "a2"],
                           env={**_env(), "SLM_FAULTS": f"crash@point={point}"}, capture_output=True)
        assert r.returncode == faults.CRASH_EXIT_CODE, r.stderr
        assert cli(copy, "fsck") == 9  # an interrupted transaction
        out[f"interrupted-{kind}"] = copy
    return out


def shared_template(root: str | Path) -> dict:
    """The templates kept in `root` across processes (scripts/mutate_fsync.py builds them once,
    with the unmutated code, and every mutant's test run starts from them)."""
    import pickle

    root = Path(root)
    saved = root / "template.pickle"
    if saved.exists():
        return pickle.loads(saved.read_bytes())
    import make_tiny_model

    root.mkdir(parents=True, exist_ok=True)
    t = build_template(root, make_tiny_model.make_tiny_model(root / "tiny", seed=0))
    saved.write_bytes(pickle.dumps(t))
    return t


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "SLM_FAULTS"}


@contextmanager
def frozen_clock():
    """Reflog times, gc's now and composition stamps from a fixed clock: the same bytes and the
    same retention decisions in every run."""
    import datetime as real_datetime

    from slm.compose import composition
    from slm.ops.store import gc
    from slm.store import reflog

    class _Clock:
        @staticmethod
        def time():
            return FIXED_TIME

    class _DateTime(real_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return real_datetime.datetime.fromtimestamp(FIXED_TIME, tz)

    saved = reflog.time, gc.time, composition.datetime
    reflog.time, gc.time, composition.datetime = _Clock, _Clock, _DateTime
    try:
        yield
    finally:
        reflog.time, gc.time, composition.datetime = saved


@contextmanager
def session(sim: PowerCut):
    """Every `slm.cli.run` inside runs under `sim` (one power-cut session over several commands)."""
    faults.pinned = sim
    faults.install(sim)
    try:
        yield sim
    finally:
        faults.pinned = None
        faults.install(None)


def prepare(case: Path, scenario: Scenario, t: dict) -> Path:
    """A fresh case directory holding the scenario's starting store; returns the store path."""
    case.mkdir(parents=True)
    store = case / "store"
    if scenario.prepare != "empty":
        src = t["template"] if scenario.prepare == "template" else t[scenario.prepare]
        shutil.copytree(src, store, symlinks=True)
    return store


def state(store: Path):
    """(refs/active, the reflog as (seq, old, new, op), names by kind and the names' reflogs
    as "logs"), or None: no store."""
    if not (store / "config.toml").is_file():
        return None
    s = StoreDir.open(store)
    names = {kind: dict(s.names.items(kind)) for kind in ("bases", "adapters", "compositions", "tags", "remotes")}
    names["logs"] = {f"{kind}/{name}": tuple((e.seq, e.old, e.new, e.op) for e in log.entries())
                     for kind in NAMED_KINDS for name, log in s.names.logged(kind)}
    return s.active_ref.read(), [(e.seq, e.old, e.new, e.op) for e in s.reflog.entries()], names


@dataclass
class Recording:
    scenario: Scenario
    before: object  # state after A
    after: object  # state after B (a clean run)
    first_op: int  # the session's index of B's first fs operation
    corrupt: frozenset[str]  # blobs whose bytes did not match their names before B (not B's doing)
    after_blobs: tuple[str, ...]  # the blobs after B: a cut right after B returned keeps exactly these
    last_op: int  # ... of its last one
    cuts: list[tuple[int, str, int, Image]] = field(default_factory=list)  # op index, mode, seed, image
    # op index last_op + 1 stands for "right after B returned"
    quarantined: bytes | None = None  # the bytes B moves to lost+found/ (quarantine scenarios)
    # the state B would have left had its I/O not failed: a cut before a failing B returned
    # may also leave that (the command had not said "failed" yet; its data may be on disk)
    intended: object = None


def record(scenario: Scenario, t: dict, case: Path, cuts: list[tuple[str, int]]) -> Recording:
    """Run A then B once under a recording session; the images of every cut at every op of B."""
    store = prepare(case, scenario, t)
    with frozen_clock(), session(PowerCut(case, None, 0, "keep-all")) as sim:
        for args in scenario.committed:
            assert cli(store, *args) == 0, (scenario.name, args)
        before = state(store)
        corrupt = frozenset(_corrupt_blobs(store))
        first = sim.count + 1
        sim.start_recording(cuts)
        sim.eio_on = scenario.eio_on
        assert cli(store, *scenario.cut) == (12 if scenario.eio_on else 0), scenario.name
        sim.count += 1  # the instant after B returned counts as one more cut point
        sim.record_cuts()
    rec = Recording(scenario, before, state(store), first, corrupt, blob_names(store), sim.count - 1,
                    sim.recorded, t["corrupt-bytes"] if scenario.quarantine else None)
    if scenario.eio_on:
        rec.intended = _intended(scenario, t, case.parent / f"{case.name}-intended")
    return rec


def _intended(scenario: Scenario, t: dict, case: Path):
    """The state after A and B with no fault at all."""
    store = prepare(case, scenario, t)
    with frozen_clock():
        for args in (*scenario.committed, scenario.cut):
            assert cli(store, *args) == 0, (scenario.name, args)
    return state(store)


def blob_names(store: Path) -> tuple[str, ...]:
    blobs = store / "objects" / "blake3"
    return tuple(sorted(p.name for p in blobs.iterdir())) if blobs.is_dir() else ()


def _corrupt_blobs(store: Path) -> list[str]:
    blobs = store / "objects" / "blake3"
    return [b.name for b in sorted(blobs.iterdir()) if b.is_file() and
            dg.of_bytes(b.read_bytes()) != dg.PREFIX + b.name] if blobs.is_dir() else []


def replay(scenario: Scenario, t: dict, case: Path, op: int, mode: str, seed: int) -> Image:
    """A real cut at session op `op` (what a failing case prints): run A and B until the power
    goes, then write the disk it leaves. Returns the image."""
    store = prepare(case, scenario, t)
    with frozen_clock(), session(PowerCut(case, op, seed, mode)) as sim:
        try:
            for args in scenario.committed:
                assert cli(store, *args) == 0, (scenario.name, args)
            cli(store, *scenario.cut)
            sim.cut_now()  # op is one past B's last: the power goes right after B returned
        except PowerCutHappened:
            pass
        assert sim.image is not None, f"op {op} is not in this scenario"
    sim.write()
    return sim.image


def image_key(image: Image) -> tuple:
    return tuple(sorted((path, None if data is None else dg.of_bytes(data))
                        for path, data in image.flat().items()))


def check_recovered(store: Path, rec: Recording, at_end: bool, recovered: set | None = None) -> list[str]:
    """The invariants after a cut (the disk is already written at `store`); the violations."""
    from slm.errors import SlmError

    try:
        return _check(store, rec, at_end, recovered)
    except SlmError as err:  # a store that fsck cannot even open (e.g. a torn config.toml)
        return [f"the store cannot be recovered: {err}"]


def _check(store: Path, rec: Recording, at_end: bool, recovered: set | None) -> list[str]:
    problems = [f"blob {name[:12]}: its bytes do not hash to its name"
                for name in _corrupt_blobs(store) if name not in rec.corrupt]
    if not (store / "config.toml").is_file():
        if rec.before is not None or at_end:
            problems.append("the store is gone (no config.toml)")
        elif cli(store, "init") != 0 or cli(store, "fsck") != 0:
            problems.append("init after a cut init does not give a clean store")
        return problems
    if at_end:
        problems += _exactly_after(store, rec)
    # through the public API (what `slm fsck` runs, without parsing a command line per case)
    if _fsck(store, repair=True).exit_code != 0:
        return problems + ["fsck --repair did not exit 0: " + _findings(store)]
    if _fsck(store, repair=False).exit_code != 0:
        return problems + ["a second fsck is not clean: " + _findings(store)]
    if rec.quarantined is not None and not _quarantined(store, rec.quarantined):
        problems.append("the corrupt blob fsck moved to lost+found/ is gone")
    ref, log, names = state(store)
    olds = [s for s in (rec.before, rec.after, rec.intended) if s is not None]
    if ref not in {s[0] for s in olds}:
        problems.append(f"refs/active names {dg.short(ref or '-')}: neither the old nor the new composition")
    if log not in [s[1] for s in olds]:
        problems.append(f"the reflog ({len(log)} lines) is neither the old one nor the old one plus the new line")
    if (log[-1][2] if log else None) != ref:
        problems.append("refs/active is not the last reflog line's composition")
    for kind in names:
        sets = [frozenset(s[2][kind].items()) for s in olds]
        both, either = frozenset.intersection(*sets), frozenset.union(*sets)
        got_kind = frozenset(names[kind].items())
        if not both <= got_kind:
            problems.append(f"{kind}: lost {sorted(n for n, _ in both - got_kind)}")
        if not got_kind <= either:
            problems.append(f"{kind}: appeared from nowhere {sorted(n for n, _ in got_kind - either)}")
    if ref is not None and not problems:
        # the same recovered store (byte for byte) activates the same way: checked once
        key = _store_key(store)
        if recovered is None or key not in recovered:
            problems += _activates_again(store, ref)
            if recovered is not None and not problems:
                recovered.add(key)
    return problems


def _exactly_after(store: Path, rec: Recording) -> list[str]:
    """A cut right after B returned: B was acknowledged, so before any repair the disk holds
    exactly what B left (names, ref, reflog, blobs), and fsck finds nothing but junk in tmp/."""
    from slm.errors import SlmError

    try:
        got, blobs = state(store), blob_names(store)
        findings = [f for f in _fsck(store, repair=False).findings if f.problem != "junk"]
    except SlmError as err:
        return [f"a cut right after the command returned left a damaged store: {err}"]
    out = []
    if got != rec.after:
        out.append("a cut right after the command returned lost some of it (names, ref or reflog)")
    if blobs != rec.after_blobs:
        out.append(f"a cut right after the command returned changed the blobs: "
                   f"{len(set(blobs) - set(rec.after_blobs))} back, {len(set(rec.after_blobs) - set(blobs))} gone")
    if findings:
        out.append("a cut right after the command returned needs a repair: "
                   + "; ".join(f"{f.problem}: {f.what}" for f in findings))
    return out


def _store_key(store: Path) -> tuple:
    return tuple(sorted((str(p.relative_to(store)), dg.of_bytes(p.read_bytes()) if p.is_file() else None)
                        for p in store.rglob("*") if p.name != "lock"))


def _fsck(store: Path, repair: bool):
    import slm

    return slm.Store.open(store).fsck(repair)


def _findings(store: Path) -> str:
    try:
        report = _fsck(store, repair=False)
    except Exception as err:  # the report of a failure: whatever stops fsck is the finding
        return f"{type(err).__name__}: {err}"
    return "; ".join(f"{f.problem}: {f.what}" for f in report.findings)


def _quarantined(store: Path, data: bytes) -> bool:
    lost = store / "lost+found"
    return lost.is_dir() and any(p.is_file() and p.read_bytes() == data for p in lost.iterdir())


def _activates_again(store: Path, ref: str) -> list[str]:
    """Switch to another composition and back to the recovered one (every blob re-hashed)."""
    import slm
    from slm.errors import SlmError

    s = slm.Store.open(store)
    try:
        recovered = s.composition(ref)
        s.activate("tf")
        s.activate(recovered)
    except SlmError as err:
        return [f"the recovered composition does not activate again: {err}"]
    if state(store)[0] != ref:
        return ["activating the recovered composition gave another composition"]
    return []


@dataclass
class Outcome:
    scenario: str
    cases: dict[str, int]  # cut cases per mode
    distinct: int  # distinct disks checked
    failures: list[str]


def run_scenario(scenario: Scenario, t: dict, work: Path, cuts: list[tuple[str, int]],
                 stop_at_first: bool = False) -> Outcome:
    rec = record(scenario, t, work / "rec", cuts)
    seen: dict[tuple, list[str]] = {}
    shared = work / "shared-blobs"
    shared.mkdir()
    recovered: set[tuple] = set()  # recovered stores already shown to activate again
    cases: dict[str, int] = {}
    failures: list[str] = []
    for i, (op, mode, seed, image) in enumerate(rec.cuts):
        cases[mode] = cases.get(mode, 0) + 1
        at_end = op == rec.last_op + 1
        key = (image_key(image), at_end)
        if key not in seen:
            case = work / f"c{i}"
            case.mkdir()
            write_image(image, case, shared)
            with frozen_clock():
                seen[key] = check_recovered(case / "store", rec, at_end, recovered)
            shutil.rmtree(case, ignore_errors=True)
        if seen[key]:
            failures.append(failure_line(scenario, op, mode, seed, rec, seen[key]))
            if stop_at_first:
                break
    return Outcome(scenario.name, cases, len(seen), failures)


def failure_line(scenario: Scenario, op: int, mode: str, seed: int, rec: Recording, problems) -> str:
    where = "after it returned" if op == rec.last_op + 1 else f"before its op {op - rec.first_op + 1}"
    return (f"{scenario.name}: power cut {where} (SLM_POWERCUT_REPLAY={scenario.name}:"
            f"op={op}:mode={mode}:seed={seed}): " + "; ".join(problems))


def parse_replay(text: str) -> tuple[str, int, str, int]:
    """'SCENARIO:op=N:mode=M:seed=S' -> (scenario, N, M, S)."""
    name, *parts = text.split(":")
    fields = dict(p.partition("=")[::2] for p in parts)
    return name, int(fields["op"]), fields["mode"], int(fields["seed"])


def cuts_for(seeds: list[int]) -> list[tuple[str, int]]:
    """drop-all and keep-all need no seed; random and torn once per seed."""
    return [("drop-all", 0), ("keep-all", 0)] + [(m, s) for s in seeds for m in ("random", "torn")]

