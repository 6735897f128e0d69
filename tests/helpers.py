"""Assertion helpers shared by the tests."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path


# The verified-digest cache and the follower's report of its last round are advisory data, not
# store state (docs/recovery.md, docs/fleet.md): any command that re-hashes a blob may refresh the
# first, and every round of `slm follow` writes the second, a refused one included.
VERIFIED_CACHE = "cache/verified-digests"
ADVISORY = (VERIFIED_CACHE, "cache/follow-status.json")


def ed25519_key(path: Path, seed: int) -> tuple[Path, str]:
    """A deterministic Ed25519 key written as PEM at `path`, and its public text ("ed25519:...")."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from slm.distribution.signing import public_key_text

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path, public_key_text(key)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file under a store with its mode and content hash (to prove nothing changed), but
    the advisory files (ADVISORY)."""
    state = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if rel in ADVISORY:
            continue
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode):
            state[rel] = ("dir",)
        else:
            state[rel] = (stat.S_IMODE(st.st_mode), hashlib.sha256(path.read_bytes()).hexdigest())
    return state


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# The tiny model's LoRA shape (scripts/make_random_lora.py) as the distribution tests make it
TINY_LORA = dict(rank=4, alpha=8.0, hidden=64, intermediate=128, layers=2, kv_dim=32, q_dim=64)


def tiny_store(root: Path, tiny_model: dict, adapters: int | dict[str, int] = 0, steps=(("activate", "tq"),),
               *, bases: dict[str, str] | None = None, lora: dict | None = None, store: Path | None = None) -> Path:
    """A store (root/store unless `store`) built by the real commands: the bases (name -> the
    tiny_model file: default `tq`, its quantized GGUF), random LoRA adapters (an int N: `a1`..`aN`
    of seeds 1..N; or name -> seed), each made in root/lora<seed> with make_random_lora's
    arguments `lora` (default: the tiny model's shape, rank 4), then each step (e.g.
    ("activate", "tq", "a1@0.5")). Build it once per module and copy it per test."""
    import make_random_lora

    from slm.cli import run

    store = store or root / "store"
    named = adapters if isinstance(adapters, dict) else {f"a{seed}": seed for seed in range(1, adapters + 1)}
    shape = lora or dict(rank=4, hidden=64, intermediate=128, layers=2, kv_dim=32)
    for seed in named.values():
        make_random_lora.make_random_lora(root / f"lora{seed}", seed=seed, **shape)
    imports = [["import", "base", tiny_model[key], "--name", name] for name, key in (bases or {"tq": "gguf_q"}).items()]
    imports += [["import", "adapter", root / f"lora{seed}", "--name", name] for name, seed in named.items()]
    for args in (["init"], *imports, *map(list, steps)):
        assert run(["--store", str(store), *map(str, args)]) == 0, args
    return store


def copy_store(template: Path, tmp_path: Path) -> Path:
    """A test's own copy of a template store (links kept as links)."""
    return Path(shutil.copytree(template, tmp_path / "store", symlinks=True))


def refused(cli, store_dir, code, *args):
    """The command fails with `code`, one line on stderr, and the store is unchanged."""
    before = snapshot(store_dir)
    r = cli("--store", store_dir, *args)
    assert r.code == code, (args, r.code, r.err)
    assert one_line(r.err), r.err
    assert snapshot(store_dir) == before, f"{args} changed the store"
    return r


@contextlib.contextmanager
def lock_held_elsewhere(store_dir):
    """Another process holds the store lock (an flock, as slm's writers take it) until the
    block ends: it waits on its stdin, not for a guessed number of seconds."""
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(store_dir / "lock")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=HANG_S)


def one_line(text: str) -> bool:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return len(lines) == 1 and "Traceback" not in text


def peak_rss_of(argv: list[str]) -> tuple[int, str]:
    """Run a command in a fresh process; return (its peak RSS in bytes, its stdout)."""
    import subprocess
    import sys

    code = (
        "import resource, subprocess, sys;"
        "r = subprocess.run(sys.argv[1:], check=True, capture_output=True, text=True);"
        "sys.stderr.write(r.stdout);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()), out.stderr


def random_overlay(kind, model, rng, names, weight=0.7, ia3_on=None):
    """A seeded random overlay of `kind` (lora, ia3, sparse) on the named weights of a model
    (GGUF row layout): what the kernel and batch tests compare paths with."""
    import numpy as np

    from slm.model.overlays import TargetData, build_overlay

    targets = []
    for name in names:
        out_f, in_f = model.t[name].shape
        if kind == "lora":
            tensors = {"A": rng.standard_normal((4, in_f)).astype(np.float32) / np.sqrt(in_f),
                       "B": rng.standard_normal((out_f, 4)).astype(np.float32) * 0.1}
        elif kind == "ia3":
            size = in_f if ia3_on == "input" else out_f
            tensors = {"vector": (1 + 0.2 * rng.standard_normal(size)).astype(np.float32)}
        else:
            idx = rng.choice(out_f * in_f, 20, replace=False).astype(np.int64)
            tensors = {"indices": idx, "values": rng.standard_normal(20).astype(np.float32) * 0.1}
        targets.append(TargetData(name, out_f, in_f, tensors, scale=2.0, ia3_on=ia3_on))
    return build_overlay(kind, weight, targets, src_layout="gguf", dst_layout="gguf", heads={})


# Waiting: for a state, never for a duration (docs/testing.md, "Under load"). The limit only
# turns a hang into a failure; a loaded machine reaches the state late, never not at all.
HANG_S = 120


def wait_until(condition, what: str, timeout: float = HANG_S, proc=None):
    """Poll `condition` until it returns something true, and return that. A process `proc`
    that ends first, or `timeout` seconds (a hang), fails the test."""
    import time

    import pytest

    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else b""
            pytest.fail(f"the process ended (exit {proc.returncode}) before {what}: {err!r}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout} s: a hang")
        time.sleep(0.001)


READ_SYSCALL = {"x86_64": 0, "aarch64": 63}  # read(2)'s number in /proc/PID/syscall


def blocked_reading_stdin(pid: int) -> bool:
    """Whether the process's main thread waits in read(0, ...): /proc/PID/syscall gives the
    system call it is in, then its arguments."""
    import platform

    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
        number = READ_SYSCALL.get(platform.machine())
        if number is None:  # another architecture: the kernel function it sleeps in says it
            return Path(f"/proc/{pid}/wchan").read_text().endswith("pipe_read")
    except OSError:  # not started, or gone
        return False
    return len(fields) > 1 and fields[0] == str(number) and int(fields[1], 16) == 0


def exact(model):
    """`model` with its kernels in the exact mode (float32 products, slm.model.modes): what a
    test comparing with transformers or the float64 oracle within 1e-3 asserts, chosen here
    rather than left to the kernels' initial setting (the default mode is int8)."""
    from slm.model import modes

    modes.use(model.kernels, modes.EXACT)
    return model


def forget_name(store_dir: Path, kind: str, name: str) -> None:
    """A name gone without a trace, its file and its log (fsck compares the two), as if it had
    never been made: what it pointed at is then reachable by nothing but what else names it."""
    from slm.store import StoreDir

    names = StoreDir.open(store_dir).names
    names.remove(kind, name)
    names.log(kind, name).path.unlink()
