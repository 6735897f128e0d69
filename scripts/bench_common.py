"""What scripts/bench.py and scripts/bench_scale.py share: the settle time between samples, the
prompt, medians, the `slm` command, the description of the machine, and the driver's end of a
worker process."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Once upon a time, in a small village,"
# Seconds between one worker's answer and the next request: a system's idle threads spin on
# the cores for a while after its last operation (torch's and llama.cpp's OpenMP-style pools,
# slm's OpenMP team): measured, the first ~0.3 s of an slm decode right after a torch
# product burst ran at half speed. Each request starts on quiet cores.
SETTLE_S = 1.0


def med(xs):
    return statistics.median(xs) if xs else None


def slm_cli(store, *args) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "slm", "--store", str(store), *map(str, args)], check=True,
                   capture_output=True)
    return time.perf_counter() - t


def peak_rss(store, *args) -> int:
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True);"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")
    out = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "slm", "--store", str(store),
                          *map(str, args)], capture_output=True, text=True, check=True)
    return int(out.stdout)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# The vector extensions that pick the kernels' paths (the hypervisor names every AMD host "AMD
# EPYC": family and model tell Zen 3 from Zen 4).
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
             "amx_tile")


def cpu_kind() -> dict:
    fields: dict = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key in ("cpu family", "model") and key.replace(" ", "_") not in fields:
                fields[key.replace(" ", "_")] = value
            elif key == "flags":
                fields["isa"] = [f for f in ISA_FLAGS if f in value.split()]
                break
    except OSError:
        pass
    return fields


class WorkerProcess:
    """The driver's end of one benchmark worker: a process started with `argv` that answers each
    request line (JSON) with one line {"value": ...} (scripts/bench.py, scripts/bench_scale.py),
    after a first line of its own once it is ready. settle: seconds of quiet before each request."""

    def __init__(self, name: str, argv: list[str], settle: float = 0.0):
        self.name, self.settle = name, settle
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} worker exited ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, **req) -> float:
        time.sleep(self.settle)
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()["value"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
