"""Crash-safety torture: random faults in random operations on one long-lived store.

    python scripts/torture.py [--rounds 300] [--seed 0] [--writers 8] [--each 50]

Each round picks a verb (import, import adapter, activate, deactivate, rollback, gc) and a
fault (a crash, EIO or ENOSPC at a random fs operation, or a crash at a random named point),
runs it in a child process, then `slm fsck --repair`, and checks the invariants: refs/active
is exactly the old or the new composition, the reflog kept every line it had (and gained at
most one), a second fsck is clean, and every blob re-hashes. Then a concurrency run:
WRITERS processes x EACH activations with a reader checking refs/active throughout.
Prints a summary; exits 1 on any violation. Figures go in docs/recovery.md.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_random_lora  # noqa: E402
import make_tiny_model  # noqa: E402


def slm(store: Path, *args, faults: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SLM_FAULTS"}
    if faults:
        env["SLM_FAULTS"] = faults
    return subprocess.run([sys.executable, "-m", "slm", "--store", str(store), *map(str, args)],
                          env=env, capture_output=True, text=True)


def state(store: Path):
    from slm.store import StoreDir

    s = StoreDir.open(store)
    return s.active_ref.read(), [(e.seq, e.old, e.new, e.op) for e in s.reflog.entries()]


def trace(store: Path, args) -> tuple[list[str], int]:
    copy = store.parent / "trace-copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(store, copy, symlinks=True)
    r = slm(copy, *args, faults="trace")
    shutil.rmtree(copy, ignore_errors=True)
    lines = [ln.split(" ", 2) for ln in r.stderr.splitlines() if ln.startswith("slm-fault ")]
    return [ln[2] for ln in lines if ln[1] == "point"], sum(ln[1] == "op" for ln in lines)


def verbs(rng: random.Random, work: Path, tiny: dict, round_no: int) -> list:
    adapters = ["a1", "a2", "a3"]
    weight = f"{rng.choice([0.25, 0.5, 1, 2])}"
    return rng.choice([
        ["import", "base", tiny["hf"], "--name", f"h{round_no}", "--quant", rng.choice(["q4_0", "q8_0", "nf4"])],
        ["import", "adapter", work / rng.choice(["lora1", "lora2", "lora3"]), "--name", f"x{round_no}"],
        ["activate", rng.choice(["tq", "tf"]), *rng.sample(adapters, rng.randint(0, 2)),
         f"a1@{weight}"] if rng.random() < 0.5 else ["activate", rng.choice(["tq", "tf"])],
        ["deactivate", rng.choice(adapters)],
        ["rollback", "-n", str(rng.randint(1, 3))],
        ["gc"],
    ])


def torture(rounds: int, seed: int, work: Path) -> Counter:
    rng = random.Random(seed)
    tiny = make_tiny_model.make_tiny_model(work / "tiny", seed=0)
    store = work / "store"
    for i in (1, 2, 3):
        make_random_lora.make_random_lora(work / f"lora{i}", rank=4, seed=i, hidden=64, intermediate=128,
                                          layers=2, kv_dim=32)
    for args in (["init"], ["import", "base", tiny["gguf_q"], "--name", "tq"],
                 ["import", "base", tiny["gguf"], "--name", "tf"],
                 *(["import", "adapter", work / f"lora{i}", "--name", f"a{i}"] for i in (1, 2, 3)),
                 ["activate", "tq"]):
        assert slm(store, *args).returncode == 0, args
    tally: Counter = Counter()
    for round_no in range(rounds):
        args = verbs(rng, work, tiny, round_no)
        points, n_ops = trace(store, args)
        if n_ops == 0:
            tally["no-op"] += 1
            continue
        kind = rng.choice(["crash", "eio", "enospc", "point"] if points else ["crash", "eio", "enospc"])
        fault = f"crash@point={rng.choice(points)}" if kind == "point" else f"{kind}@op={rng.randint(1, n_ops)}"
        before = state(store)
        r = slm(store, *args, faults=fault)
        if "Traceback" in r.stderr:
            raise SystemExit(f"traceback in round {round_no} ({args}, {fault}):\n{r.stderr}")
        repair = slm(store, "fsck", "--repair")
        check = slm(store, "fsck")
        ref, entries = state(store)
        old_ref, old_entries = before
        ok = (repair.returncode == 0 and check.returncode == 0
              and entries[: len(old_entries)] == old_entries and len(entries) - len(old_entries) in (0, 1)
              and ref == (entries[-1][2] if entries else None)
              and (ref == old_ref or len(entries) == len(old_entries) + 1))
        if not ok:
            raise SystemExit(f"VIOLATION in round {round_no}: {args} with {fault}\n"
                             f"{repair.stdout}{repair.stderr}{check.stdout}{check.stderr}")
        tally[f"{args[0]} {kind}"] += 1
        tally["rounds"] += 1
        tally["committed" if len(entries) > len(old_entries) else "rolled back or no transition"] += 1
    return tally


def concurrency(work: Path, writers: int, each: int) -> dict:
    store = work / "store"
    writer = ("import sys\nfrom slm.ops.store.activation import activate\nfrom slm.store import StoreDir\n"
              "s = StoreDir.open(sys.argv[1]); w = int(sys.argv[2])\n"
              "for i in range(int(sys.argv[3])): activate(s, 'tq', [f'a1@{1000000 + w * 10000 + i}'])\n")
    reader = ("import sys, time\nfrom slm.store import StoreDir\ns = StoreDir.open(sys.argv[1]); n = 0\n"
              "while not (s.root / 'tmp' / 'stop').exists(): s.active_ref.read(); n += 1\nprint(n)\n")
    start = len(state(store)[1])
    t0 = time.perf_counter()
    rd = subprocess.Popen([sys.executable, "-c", reader, str(store)], stdout=subprocess.PIPE, text=True)
    ps = [subprocess.Popen([sys.executable, "-c", writer, str(store), str(w), str(each)]) for w in range(writers)]
    codes = [p.wait() for p in ps]
    (store / "tmp" / "stop").touch()
    reads = int(rd.communicate()[0])
    (store / "tmp" / "stop").unlink()
    ref, entries = state(store)
    ok = (codes == [0] * writers and rd.returncode == 0 and len(entries) - start == writers * each
          and ref == entries[-1][2] and slm(store, "fsck").returncode == 0)
    return {"ok": ok, "transitions": len(entries) - start, "reader_reads": reads,
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("--each", type=int, default=50)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="slm-torture-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        tally = torture(a.rounds, a.seed, work)
        print(f"fault rounds: {tally['rounds']} in {time.perf_counter() - t0:.0f}s, 0 violations")
        for key, n in sorted(tally.items()):
            print(f"  {key:32s} {n}")
        conc = concurrency(work, a.writers, a.each)
        print(f"concurrency: {a.writers} writers x {a.each}: {conc}")
        return 0 if conc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
