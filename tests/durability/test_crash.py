"""Crashes and I/O errors at every step: afterwards `slm fsck --repair` leaves exactly the old
or the new composition active, a second fsck is clean, and the reflog has no torn or lost line.

Faults are injected through the fs layer (slm/store/testing/faults.py) in a child process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from slm.cli import run as slm_run
from slm.store import StoreDir
from slm.store.testing.faults import CRASH_EXIT_CODE

from helpers import ADVISORY, forget_name, tiny_store

pytestmark = pytest.mark.slow


def _slm(store_dir, *args, faults=None, check=False):
    env = {k: v for k, v in os.environ.items() if k != "SLM_FAULTS"}
    if faults:
        env["SLM_FAULTS"] = faults
    return subprocess.run([sys.executable, "-m", "slm", "--store", str(store_dir), *map(str, args)],
                          env=env, capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """A store with two bases, two adapters, three transitions in its reflog, and orphan blobs."""
    root = tmp_path_factory.mktemp("crash")
    store = tiny_store(root, tiny_model, {"a1": 1, "a2": 2, "a3": 3},
                       [("activate", "tf"), ("activate", "tq"), ("activate", "tq", "a1")],
                       bases={"tq": "gguf_q", "tf": "gguf"})
    # blobs that only gc can reach: an adapter whose name was removed
    forget_name(store, "adapters", "a3")
    _slm(store, "fsck", check=True)
    return {"store": store, "root": root, "tiny": tiny_model}


def _copy(template, tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(template["store"], dst, symlinks=True)
    return dst


VERBS = {
    "import": lambda t: ["import", "base", t["tiny"]["hf"], "--name", "th", "--quant", "q4_0"],
    "import-adapter": lambda t: ["import", "adapter", t["root"] / "lora2", "--name", "a2b"],
    "import-adapter-move": lambda t: ["import", "adapter", t["root"] / "lora2", "--name", "a1"],  # a1 moves
    "tag": lambda t: ["tag", "t1", "tq+a2@0.5"],
    "activate": lambda t: ["activate", "tq", "a1", "a2@0.5"],
    "deactivate": lambda t: ["deactivate", "a1"],
    "rollback": lambda t: ["rollback", "-n", "2"],
    "gc": lambda t: ["gc"],
}


def _trace(store_dir, args) -> tuple[list[str], int]:
    r = _slm(store_dir, *args, faults="trace")
    assert r.returncode == 0, r.stderr
    lines = [ln.split(" ", 2) for ln in r.stderr.splitlines() if ln.startswith("slm-fault ")]
    points = [ln[2] for ln in lines if ln[1] == "point"]
    ops = sum(1 for ln in lines if ln[1] == "op")
    return points, ops


def _state(store_dir):
    """(refs/active, the reflog as (seq, old, new, op)); times differ from run to run."""
    s = StoreDir.open(store_dir)
    return s.active_ref.read(), [(e.seq, e.old, e.new, e.op) for e in s.reflog.entries()]


def _recover_and_check(store_dir, before, after_ok):
    """fsck --repair, then everything must be consistent and old-or-new."""
    assert slm_run(["--store", str(store_dir), "fsck", "--repair"]) == 0
    assert slm_run(["--store", str(store_dir), "fsck"]) == 0, "a second fsck is clean"
    ref, entries = _state(store_dir)
    old_ref, old_entries = before
    new_ref, new_entries = after_ok
    assert ref in (old_ref, new_ref), "exactly the old or the new composition"
    assert entries in (old_entries, new_entries), "no torn, lost or extra reflog line"
    assert (entries[-1][2] if entries else None) == ref
    assert list((store_dir / "tmp").iterdir()) == []


def _expected_after(template, tmp_path, args):
    clean = _copy(template, tmp_path / "clean")
    assert _slm(clean, *args).returncode == 0
    return _state(clean)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_crash_at_every_named_point(template, tmp_path, verb):
    args = VERBS[verb](template)
    points, _ = _trace(_copy(template, tmp_path / "trace"), args)
    assert points, f"{verb} passes no named fault point"
    after = _expected_after(template, tmp_path, args)
    for i, point in enumerate(points):
        store_dir = _copy(template, tmp_path / f"p{i}")
        before = _state(store_dir)
        r = _slm(store_dir, *args, faults=f"crash@point={point}")
        assert r.returncode == CRASH_EXIT_CODE, (point, r.stderr)
        _recover_and_check(store_dir, before, after)


def _trace_ops(store_dir, args) -> list[tuple[str, str]]:
    """(operation, detail) of every fs operation a clean run of `args` performs, in order."""
    r = _slm(store_dir, *args, faults="trace")
    assert r.returncode == 0, r.stderr
    return [tuple(ln.split(" ", 4)[3:5]) for ln in r.stderr.splitlines() if ln.startswith("slm-fault op ")]


def _commit_op(ops: list[tuple[str, str]], verb: str) -> int:
    """The 1-based index of the fs operation that commits `verb` (docs/recovery.md): the fsync of
    the reflog line for a switch, of the name's reflog line for an import (names are refs with
    a history: the last fsync of the append, its directory's when the append created the log)."""
    if verb.startswith("import") or verb == "tag":
        kind = {"import": "bases", "tag": "tags"}.get(verb, "adapters")
        hits = [i for i, (op, detail) in enumerate(ops, 1)
                if op in ("fsync", "fsync_dir") and f"/logs/names/{kind}" in detail]
        assert 1 <= len(hits) <= 2, ops
        return hits[-1]
    else:
        hits = [i for i, (op, detail) in enumerate(ops, 1) if op == "fsync" and detail.endswith("logs/active")]
    assert len(hits) == 1, ops
    return hits[0]


def snapshot(store_dir) -> dict[str, bytes | None]:
    """Every entry of a store (files with their bytes, directories as None), the lock and the
    advisory files (helpers.ADVISORY: not store state) excluded."""
    out = {}
    for path in sorted(store_dir.rglob("*")):
        rel = str(path.relative_to(store_dir))
        if rel not in ("lock", *ADVISORY):
            out[rel] = None if path.is_dir() else path.read_bytes()
    return out


def test_crash_at_every_operation_of_an_activation(template, tmp_path):
    args = VERBS["activate"](template)
    n_ops = len(_trace_ops(_copy(template, tmp_path / "trace"), args))
    assert n_ops >= 10
    after = _expected_after(template, tmp_path, args)
    for op in range(1, n_ops + 1):
        store_dir = _copy(template, tmp_path / f"op{op}")
        before = _state(store_dir)
        r = _slm(store_dir, *args, faults=f"crash@op={op}")
        assert r.returncode == CRASH_EXIT_CODE, (op, r.stderr)
        _recover_and_check(store_dir, before, after)


@pytest.mark.parametrize("fault", ["eio", "enospc"])
@pytest.mark.parametrize("verb", ["activate", "rollback", "deactivate", "import-adapter", "import-adapter-move", "tag"])
def test_io_error_at_every_operation_obeys_the_commit_point(template, tmp_path, verb, fault):
    """The documented contract (docs/exit-codes.md, docs/recovery.md): an I/O error before the
    commit point exits 12 and leaves the store byte for byte as it was (fsck clean without
    --repair); one after it exits 13, the change is committed, and fsck --repair finishes it."""
    args = VERBS[verb](template)
    ops = _trace_ops(_copy(template, tmp_path / "trace"), args)
    commit = _commit_op(ops, verb)
    after = _expected_after(template, tmp_path, args)
    for op in range(1, len(ops) + 1):
        store_dir = _copy(template, tmp_path / f"op{op}")
        files = snapshot(store_dir)
        r = _slm(store_dir, *args, faults=f"{fault}@op={op}")
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, (op, r.stderr)
        if op <= commit:
            assert r.returncode == 12, (op, ops[op - 1], r.returncode, r.stderr)
            assert snapshot(store_dir) == files, (op, ops[op - 1], "a failed command changed the store")
            assert slm_run(["--store", str(store_dir), "fsck"]) == 0
        else:
            assert r.returncode == 13, (op, ops[op - 1], r.returncode, r.stderr)
            assert "committed" in r.stderr or "imported" in r.stderr, r.stderr
            assert slm_run(["--store", str(store_dir), "fsck", "--repair"]) == 0
            assert slm_run(["--store", str(store_dir), "fsck"]) == 0
            assert _state(store_dir) == after or verb.startswith("import")
