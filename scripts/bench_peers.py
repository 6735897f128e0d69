"""llama.cpp's own tools as the benchmark peer, and the machine's read bandwidth.

The tools (llama-bench, llama-batched-bench, llama-quantize) are built by
scripts/build_llama_tools.sh (`make peers`) into .peers/bin from the llama.cpp that the
llama-cpp-python 0.3.36 sdist vendors. Each function here runs one tool once and returns its
figure, so that scripts/bench_scale.py can interleave them with slm's samples run by run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = Path(os.environ.get("SLM_PEERS_DIR", HERE.parent / ".peers"))
BIN = PEERS / "bin"
TOOLS = ("llama-bench", "llama-batched-bench", "llama-server", "llama-quantize")
THREADS = 2


def tool(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `make peers` (scripts/build_llama_tools.sh)")
    return path


def build_info() -> str:
    """What scripts/build_llama_tools.sh recorded: the llama.cpp version and the cmake flags."""
    stamp = PEERS / "tools.stamp"
    if stamp.exists():
        return stamp.read_text().strip()
    cache = PEERS / "build" / "CMakeCache.txt"
    if not cache.exists():
        return "not built"
    # some tools built, the stamp not yet written (the build was stopped): the cache's flags
    keys = ("CMAKE_BUILD_TYPE", "GGML_NATIVE", "BUILD_SHARED_LIBS", "LLAMA_BUILD_TESTS", "GGML_OPENMP")
    flags = [line.split(":", 1)[0] + "=" + line.split("=", 1)[1] for line in cache.read_text().splitlines()
             if line.split(":", 1)[0] in keys]
    built = [t for t in TOOLS if (BIN / t).exists()]
    return f"vendored llama.cpp of llama-cpp-python 0.3.36, partial build ({', '.join(built)})\ncmake: {' '.join(flags)}"


def llama_bench(gguf: Path, op: str, n: int, threads: int = THREADS) -> float:
    """One llama-bench repetition (-r 1) of decode (`-n N -p 0`) or prefill (`-p N -n 0`) on
    `gguf` with `threads` threads; its tokens per second."""
    shape = ["-n", str(n), "-p", "0"] if op == "decode" else ["-p", str(n), "-n", "0"]
    out = subprocess.run([str(tool("llama-bench")), "-m", str(gguf), "-t", str(threads), "-r", "1", "-o", "json",
                          *shape], capture_output=True, text=True, check=True, timeout=3600).stdout
    rows = json.loads(out)
    if len(rows) != 1:
        raise RuntimeError(f"llama-bench gave {len(rows)} results, expected 1")
    return float(rows[0]["avg_ts"])


def llama_batched_bench(gguf: Path, parallel: int, prompt: int, steps: int, threads: int = THREADS) -> dict:
    """llama-batched-bench with `parallel` sequences, each a prompt of `prompt` tokens (not
    shared) then `steps` decode steps: the aggregate decode tok/s (speed_tg, every sequence's
    tokens over the decode time) and the whole run's."""
    ctx = parallel * (prompt + steps) + 16
    out = subprocess.run([str(tool("llama-batched-bench")), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
                          "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(prompt), "-ntg", str(steps),
                          "-npl", str(parallel), "--output-format", "jsonl"],
                         capture_output=True, text=True, check=True, timeout=3600)
    for line in (out.stdout + "\n" + out.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            row = json.loads(line)
            return {"decode_tok_s": row["speed_tg"], "total_tok_s": row["speed"], "prefill_tok_s": row["speed_pp"]}
    raise RuntimeError("llama-batched-bench printed no result")


def requantize(src: Path, dst: Path, qtype: str) -> Path:
    """`src` requantized to `qtype` by llama-quantize (--allow-requantize: from a quantized file,
    as when an operator converts a downloaded Q4_1 to Q4_0); made once."""
    if not dst.exists():
        tmp = dst.with_name(dst.name + ".part")
        subprocess.run([str(tool("llama-quantize")), "--allow-requantize", str(src), str(tmp), qtype, str(THREADS)],
                       check=True, capture_output=True, timeout=3600)
        tmp.rename(dst)
    return dst


def read_bandwidth(threads: int = THREADS, repetitions: int = 15, mib: int = 1024) -> dict:
    """The machine's read bandwidth with `threads` threads (scripts/read_bandwidth.c, built here
    once with the native compiler): a 1 GiB array summed `repetitions` times; GB/s, median."""
    exe = BIN / "read-bandwidth"
    src = HERE / "read_bandwidth.c"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        BIN.mkdir(parents=True, exist_ok=True)
        # a plain AVX2 build where AMX is reported (a -march=native binary may die there: see
        # scripts/llama_cpp_cmake_args.sh); the loop needs nothing newer
        arch = "-mavx2" if "amx_tile" in Path("/proc/cpuinfo").read_text() else "-march=native"
        subprocess.run(["cc", "-O3", arch, "-fopenmp", str(src), "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run([str(exe), str(threads), str(repetitions), str(mib)], capture_output=True, text=True,
                         check=True, timeout=600).stdout
    return json.loads(out)
