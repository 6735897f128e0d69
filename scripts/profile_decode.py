"""Where slm's decode time goes: greedy decode steps on one GGUF under `perf record`, the
recording limited to the timed steps (attached after the import, staging and warm-up).

    python scripts/profile_decode.py FILE.gguf [--activations float32|int8] [--tokens 64]

Prints the decode rate and `perf report`'s top symbols (self time). Needs perf
(linux-perf / linux-tools); notes/perf-notes.md has the findings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the `slm` command sets it

import numpy as np  # noqa: E402


def decode(gguf: Path, work: Path, activations: str, tokens: int) -> None:
    import slm
    from slm.ops.store.activation import activate
    from slm.ops.store.importing import import_base
    from slm.ops.infer.staging import StagedCompositions
    from slm.store import init_store

    store, _ = init_store(work / "store")
    import_base(store, gguf, "base")
    slm.keep_freed_memory()
    m = StagedCompositions(store).switch(activate(store, "base", []).active.id).model
    m.kernels.set_activations(activations)
    cache = m.new_cache(8 + tokens + 4)
    logits = m.forward(np.arange(100, 108), cache, "last")
    for _ in range(4):  # warm-up
        logits = m.forward(np.asarray([int(np.argmax(logits[-1]))]), cache, "last")
    print("START", flush=True)
    sys.stdin.readline()  # perf is attached
    t = time.perf_counter()
    for _ in range(tokens):
        logits = m.forward(np.asarray([int(np.argmax(logits[-1]))]), cache, "last")
    print(f"{activations}: {tokens / (time.perf_counter() - t):.2f} tok/s", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("--activations", default="float32", choices=["float32", "int8"])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        decode(a.gguf, a.child, a.activations, a.tokens)
        return 0
    work = Path(tempfile.mkdtemp(prefix="slm-profile-"))
    try:
        child = subprocess.Popen([sys.executable, __file__, str(a.gguf), "--activations", a.activations,
                                  "--tokens", str(a.tokens), "--child", str(work)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        while child.stdout.readline().strip() != "START":
            if child.poll() is not None:
                return 1
        data = work / "perf.data"
        perf = subprocess.Popen(["perf", "record", "-F", "999", "-o", str(data), "-p", str(child.pid)],
                                stderr=subprocess.DEVNULL)
        time.sleep(1)
        child.stdin.write("\n")
        child.stdin.flush()
        print(child.stdout.readline().strip())
        perf.send_signal(2)  # SIGINT: perf writes its data and exits
        perf.wait(timeout=120)
        child.wait(timeout=120)
        report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,symbol",
                                 "--stdio"], capture_output=True, text=True).stdout
        rows = [line[:110].rstrip() for line in report.splitlines() if "%" in line and not line.startswith("#")]
        print("\n".join(rows[:25]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
