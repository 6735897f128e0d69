"""The import figure of scripts/bench.py and scripts/bench_scale.py, and the disk it is bounded by.

An import's speed is mostly the disk's: `slm import base` writes every byte of the file, and
the same disk can write at half the speed in one minute that it reaches in the next (writeback
of an earlier store's deletion, other tenants of the host; notes/perf-notes.md). One timed
import says little; so here:

- `import_figures`: `slm import base` (the command, as a user runs it) RUNS times, each into a
  fresh store, each after the previous store is deleted, `os.sync()` and SETTLE_S of quiet, so
  that no sample pays for the one before; the median in MB/s (10^6 bytes, as issue 35 counts)
  and MiB/s, and every sample (wall seconds, the command's own seconds, CPU seconds, peak RSS,
  load).
- `write_bandwidth` (and `import_and_disk`, where a round of it precedes each import): in the
  same run, in the same directory, the disk's sequential write bandwidth the way an import
  writes its blobs (slm.store.fs_direct: O_DIRECT where the file system takes it, in
  BUFFER-sized writes, then fdatasync; as many files at once as the sync pool has threads),
  and as one stream; medians of RUNS, each file removed.

The import's share of that bandwidth says how far it is from what this disk can do.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RUNS = 3
SETTLE_S = 2.0  # after os.sync(): the previous sample's deletion and writeback have settled
WRITE_MIB = 2048


def _settle() -> float:
    """os.sync(), then SETTLE_S of quiet; the 1-minute load average at the end."""
    os.sync()
    time.sleep(SETTLE_S)
    return round(os.getloadavg()[0], 2)


def _warm(path: Path) -> None:
    """Read the file once, untimed, so every sample reads it from the page cache alike."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass


# `python -m slm` that writes its own peak RSS (VmHWM, this process's memory since its exec) to
# stderr as it exits: the rusage of a child started by vfork (as subprocess does) counts the
# parent's pages as they were at the exec, so a benchmark holding a model made an import look
# 800 MB large
_WITH_PEAK = (
    "import atexit, runpy, sys\n"
    "def _peak():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            sys.stderr.write('peak-rss-kib ' + line.split()[1] + '\\n')\n"
    "atexit.register(_peak)\n"
    "sys.argv[0] = 'slm'\n"
    "runpy.run_module('slm', run_name='__main__', alter_sys=True)\n")


def _run_import(store: Path, gguf: Path, name: str) -> dict:
    """One `slm import base` in a process of its own: its wall time, CPU time (os.wait4: this
    child's own) and peak RSS (its own VmHWM, _WITH_PEAK)."""
    argv = [sys.executable, "-c", _WITH_PEAK, "--store", str(store), "import", "base", str(gguf), "-n", name, "--json"]
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here, so Popen never waits for it
        wall = time.perf_counter() - t
        proc.stdout.close()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise RuntimeError(f"slm import base failed ({proc.returncode}): {err.read().decode(errors='replace').strip()}")
        err.seek(0)
        peaks = [int(line.split()[1]) for line in err.read().decode(errors="replace").splitlines()
                 if line.startswith("peak-rss-kib ")]
    result = json.loads(out)
    return {"seconds": round(wall, 3), "command_seconds": result["seconds"], "total_bytes": result["total_bytes"],
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "peak_rss_bytes": peaks[-1] * 1024 if peaks else None}


def _import_sample(store: Path, gguf: Path, name: str) -> dict:
    """One import into a fresh store at `store` (the previous one deleted, then _settle)."""
    from slm.store import init_store

    shutil.rmtree(store, ignore_errors=True)
    init_store(store)
    load = _settle()
    sample = _run_import(store, gguf, name) | {"load": load}
    print(f"{gguf.name}: import {sample}", file=sys.stderr, flush=True)
    return sample


def import_figures(gguf: Path, work: Path, name: str = "base", runs: int = RUNS,
                   disk: bool = False) -> tuple[dict, Path]:
    """`runs` imports of `gguf` (each into a fresh store at work/"store"); the figures and the
    store of the last one, kept for the caller's other measurements. With `disk`, each import
    takes turns with a round of the disk's write bandwidth in `work` (_disk_samples: the two
    see the disk in the same minutes), and the import's share of it."""
    store = work / "store"
    _warm(gguf)
    samples, disk_samples = [], []
    for _ in range(runs):
        if disk:
            disk_samples += _disk_samples(work, WRITE_MIB << 20)
        samples.append(_import_sample(store, gguf, name))
    total = samples[0]["total_bytes"]
    seconds = statistics.median(s["seconds"] for s in samples)
    figures = {"mb_s": total / 1e6 / seconds, "mib_s": total / 2**20 / seconds, "median_seconds": seconds,
               "total_bytes": total, "samples": samples,
               "median_cpu_s": statistics.median(s["cpu_s"] for s in samples),
               "peak_rss_bytes": max(s["peak_rss_bytes"] for s in samples)}
    if disk:
        figures["disk_write"] = _disk_summary(disk_samples)
        figures["share_of_disk_write"] = figures["mb_s"] / figures["disk_write"]["mb_s"]
    return figures, store


def _write_file(path: Path, size: int) -> bool:
    """Write `size` bytes of random data to a new file at `path` as slm.store.fs_direct writes a
    blob (O_DIRECT, aligned BUFFER-sized writes; the page cache where the file system refuses
    O_DIRECT), then fdatasync; whether O_DIRECT was used. The file is removed."""
    from slm.store.fs_direct import BUFFER

    buf = mmap.mmap(-1, BUFFER)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(BUFFER))  # not zeros: nothing between here and the disk can shrink them
    view = memoryview(buf)
    direct = getattr(os, "O_DIRECT", 0)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(path, flags | direct, 0o600)
    except OSError:
        fd, direct = os.open(path, flags, 0o600), 0
    try:
        for _ in range(size // BUFFER):
            os.write(fd, view)
        os.fdatasync(fd)
        return bool(direct)
    finally:
        os.close(fd)
        os.unlink(path)
        view.release()
        buf.close()


def _write_files(directory: Path, size: int, writers: int) -> tuple[float, bool]:
    """`size` bytes written as `writers` files at once, one a thread (an import writes its blobs
    on slm.store.sync_pool's threads); (seconds until every file is written and fdatasynced,
    whether each went by O_DIRECT)."""
    with ThreadPoolExecutor(max_workers=writers) as pool:
        t = time.perf_counter()
        jobs = [pool.submit(_write_file, directory / f"write-bandwidth-{i}", size // writers) for i in range(writers)]
        direct = [job.result() for job in jobs]
        return time.perf_counter() - t, all(direct)


def _disk_samples(directory: Path, size: int) -> list[dict]:
    """One round of the disk's write bandwidth in `directory`: `size` bytes as an import writes
    them (as many files at once as slm.store.sync_pool.Syncs has threads) and as one stream
    (what `dd oflag=direct` measures), each after _settle, with its load."""
    from slm.store.sync_pool import Syncs

    samples = []
    for writers in (Syncs.THREADS, 1):
        load = _settle()
        seconds, direct = _write_files(directory, size, writers)
        samples.append({"writers": writers, "seconds": round(seconds, 3), "mb_s": round(size / 1e6 / seconds, 1),
                        "bytes": size, "direct": direct, "load": load})
        print(f"disk write: {samples[-1]}", file=sys.stderr, flush=True)
    return samples


def _disk_summary(samples: list[dict]) -> dict:
    """`mb_s`: the median as an import writes (the import's ceiling); `one_stream_mb_s`: as one
    stream; `direct`: whether every sample went by O_DIRECT."""
    writers = max(s["writers"] for s in samples)

    def median(n: int) -> float:
        return statistics.median(s["mb_s"] for s in samples if s["writers"] == n)

    return {"mb_s": median(writers), "writers": writers, "one_stream_mb_s": median(1), "bytes": samples[0]["bytes"],
            "direct": all(s["direct"] for s in samples), "samples": samples}


def write_bandwidth(directory: Path, mib: int = WRITE_MIB, runs: int = RUNS) -> dict:
    """The disk's sequential write bandwidth in `directory` alone: `runs` rounds of
    _disk_samples, summarised by _disk_summary (MB/s)."""
    return _disk_summary([s for _ in range(runs) for s in _disk_samples(directory, mib << 20)])


def import_and_disk(gguf: Path, work: Path, name: str = "base", runs: int = RUNS) -> tuple[dict, Path]:
    """import_figures with the disk's write bandwidth, taking turns, in `work`."""
    return import_figures(gguf, work, name, runs, disk=True)
