"""The power-cut matrix for files slm writes where a user asks (slm/store/outputs.py): `slm
export` in every format and `slm run --logits-out`, and the check that every fsync the
simulator hears of really ran (docs/recovery.md).

An output is acknowledged when its command returns 0. Recorded like the store's scenarios
(tests/durability/durability_matrix.py: a cut before each fs operation of the command, and one right
after it returned, in every mode), each disk must show at the output's name:

  - after the command returned: exactly the output it wrote (a file's bytes, or a directory's
    every entry and byte);
  - before: the old state (nothing, or the file an acknowledged earlier run wrote there) or the
    whole new output, never a partial one. Temporaries beside it (hidden, complete or not) are
    allowed: they are junk a cut may leave, never under the requested name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import durability_matrix as dm
from slm.store.testing.powercut import PowerCut


@dataclass(frozen=True)
class OutputCase:
    name: str
    output: str  # the output's name in the case directory (the power-cut root)
    args: tuple[str, ...]  # the command, with {out} for the output's absolute path
    before: tuple[str, ...] | None = None  # an acknowledged command writing an older output there


def output_cases() -> list[OutputCase]:
    run = ("run", "-n", "2", "--logits-out", "{out}")
    return [
        OutputCase("export-tar", "out.tar", ("export", "-o", "{out}")),
        OutputCase("export-layout-dir", "out", ("export", "-o", "{out}")),
        OutputCase("export-gguf-lora", "out.gguf", ("export", "--format", "gguf-lora", "-o", "{out}")),
        OutputCase("export-peft", "out-peft", ("export", "--format", "peft", "-o", "{out}")),
        OutputCase("export-gguf-base", "base.gguf", ("export", "tq", "--format", "gguf", "-o", "{out}")),
        OutputCase("logits-out", "x.npy", (*run, "hello")),
        OutputCase("logits-out-replacing", "x.npy", (*run, "hello"), before=(*run, "good morning")),
    ]


def _args(args: tuple[str, ...], out: Path) -> tuple[str, ...]:
    return tuple(a.replace("{out}", str(out)) for a in args)


def _flat(path: Path, prefix: str) -> dict[str, bytes | None]:
    """What stands at `path` as Image.flat() shows it: path -> bytes, None for a directory."""
    if not os.path.lexists(path):
        return {}
    if path.is_file():
        return {prefix: path.read_bytes()}
    out: dict[str, bytes | None] = {prefix: None}
    for child in sorted(path.rglob("*")):
        out[f"{prefix}/{child.relative_to(path)}"] = None if child.is_dir() else child.read_bytes()
    return out


def _at(flat: dict[str, bytes | None], name: str) -> dict[str, bytes | None]:
    return {p: v for p, v in flat.items() if p == name or p.startswith(name + "/")}


def _old(case: OutputCase, t: dict, work: Path) -> dict[str, bytes | None]:
    """The output the acknowledged earlier command leaves (the same command on a copy)."""
    if case.before is None:
        return {}
    scenario = dm.Scenario(case.name, (), ())
    store = dm.prepare(work, scenario, t)
    with dm.frozen_clock():
        assert dm.cli(store, *_args(case.before, work / case.output)) == 0, case.name
    return _flat(work / case.output, case.output)


def run_output_case(case: OutputCase, t: dict, work: Path, cuts: list[tuple[str, int]],
                    stop_at_first: bool = False) -> tuple[int, list[str]]:
    """(cut cases checked, failures) for every cut of the command writing the output."""
    rec_dir = work / "rec"
    out = rec_dir / case.output
    committed = (_args(case.before, out),) if case.before else ()
    scenario = dm.Scenario(case.name, committed, _args(case.args, out))
    rec = dm.record(scenario, t, rec_dir, cuts)
    new = _flat(out, case.output)
    old = _old(case, t, work / "old")
    assert new and new != old, f"{case.name}: the command wrote no new output"
    failures = []
    for op, mode, seed, image in rec.cuts:
        got = _at(image.flat(), case.output)
        after_return = op == rec.last_op + 1
        if after_return and got != new:
            problem = "the output it reported written is not all there" if got != old else "the output is gone"
        elif not after_return and got not in (old, new):
            problem = "a partial output stands under the requested name"
        else:
            continue
        where = "after it returned" if after_return else f"before its op {op - rec.first_op + 1}"
        failures.append(f"{case.name}: power cut {where} ({mode}, seed {seed}): {problem}")
        if stop_at_first:
            break
    return len(rec.cuts), failures


def fsyncs_of_an_activation(t: dict, work: Path) -> list[tuple[str, tuple[int, int]]]:
    """Run an activation under the simulator, with os.fsync and os.fdatasync counted: the events
    ("synced", file) of each real call and ("heard", file) of each the simulator was told of,
    in order (file: device and inode of the descriptor)."""
    events: list[tuple[str, tuple[int, int]]] = []

    def identity(fd: int) -> tuple[int, int]:
        info = os.fstat(fd)
        return info.st_dev, info.st_ino

    def counted(real):
        def call(fd):
            result = real(fd)
            events.append(("synced", identity(fd)))
            return result
        return call

    scenario = dm.Scenario("fsync-count", (), ())
    store = dm.prepare(work, scenario, t)
    sim = PowerCut(work, None, 0, "keep-all")
    told = sim.observe_sync

    def heard(fd, path):
        events.append(("heard", identity(fd)))
        told(fd, path)
    sim.observe_sync = heard  # faults.install hands the fs layer this attribute
    saved = os.fsync, os.fdatasync
    os.fsync, os.fdatasync = counted(os.fsync), counted(os.fdatasync)
    try:
        with dm.frozen_clock(), dm.session(sim):
            assert dm.cli(store, "activate", "tq", "a1", "a2@0.5") == 0
    finally:
        os.fsync, os.fdatasync = saved
    return events
