"""Servers as benchmark subjects: `slm serve` and llama.cpp's `llama-server`, each started on
loopback for the length of a `with` block (ready within a deadline, stopped and if need be
killed on the way out, whatever happens inside), and N completions sent to one at once.

Used by scripts/bench.py (bench_inprocess.bench_serve_http) and scripts/bench_scale.py (8
concurrent requests against `llama-server -np 8`).
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

READY_S = 900.0  # a server that has not said it is ready by then has failed (an 8B file: packing, paging in)
REQUEST_S = 1800.0  # one completion's deadline (8 long ones on a loaded 2-core machine)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick; llama-server takes no port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@contextmanager
def slm_serve(store: Path, max_batch: int = 8, env: dict | None = None):
    """`slm serve --port 0 --max-batch N` on `store` (its active composition, and any spec a
    request names); yields its base URL once it has said where it listens. env: the server
    process's environment (None: this one's)."""
    proc = subprocess.Popen([sys.executable, "-m", "slm", "--store", str(store), "serve", "--port", "0",
                             "--max-batch", str(max_batch)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, env=env)
    lines: queue.Queue = queue.Queue()

    def drain() -> None:  # the pipe read to its end, so that the server never blocks on it
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline, url, said = time.monotonic() + READY_S, None, []
        while url is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"slm serve did not say where it listens within {READY_S:.0f} s") from None
            if line is None:
                raise RuntimeError(f"slm serve exited ({proc.wait()}): {''.join(said[-5:])}")
            said.append(line)
            if "listening on " in line:
                url = line.split("listening on ")[1].split()[0]
        yield url
    finally:
        _stop(proc)


@contextmanager
def llama_server(exe: Path, gguf: Path, parallel: int, ctx_per_slot: int, threads: int, log: Path):
    """`llama-server -np parallel` on `gguf`, 127.0.0.1 on a free port, a context of
    parallel x ctx_per_slot (each slot its share), `threads` threads for decode and prompts, no
    web UI; yields its base URL once /health answers 200. Its output goes to `log`."""
    port = free_port()
    cmd = [str(exe), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(parallel),
           "-c", str(parallel * ctx_per_slot), "-t", str(threads), "-tb", str(threads), "--no-webui"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while it loads the model
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server not ready within {READY_S:.0f} s; see {log}")
            time.sleep(0.5)
        yield url
    finally:
        _stop(proc)


def concurrent_completions(url: str, models: list[str], prompts: list[str], max_tokens: int) -> dict:
    """One greedy /v1/completions request per (model, prompt), all sent at once; the aggregate
    tokens per second (every request's completion tokens over the wall time from the first
    sent to the last answered), and the tokens of each."""
    tokens: list = [None] * len(models)
    errors: list = []

    def ask(i: int) -> None:
        body = json.dumps({"model": models[i], "prompt": prompts[i], "max_tokens": max_tokens,
                           "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_S) as r:
                tokens[i] = json.loads(r.read())["usage"]["completion_tokens"]
        except Exception as err:  # reported below: a failed request fails the sample, with its reason
            errors.append(f"request {i}: {err}")

    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(models))]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(REQUEST_S)
    elapsed = time.perf_counter() - t
    if errors or any(x is None for x in tokens):
        raise RuntimeError(f"{url}: {'; '.join(errors) or 'a request did not finish in time'}")
    return {"tok_s": sum(tokens) / elapsed, "tokens": tokens, "wall_s": elapsed}


# `slm serve`'s /metrics series that say where its engine's time went (docs/serve.md)
ENGINE_SERIES = {"steps": "slm_decode_step_seconds_count", "step_s": "slm_decode_step_seconds_sum",
                 "rows": "slm_batch_rows_sum", "compositions": "slm_step_compositions_sum",
                 "prefill_chunks": "slm_prefill_chunk_seconds_count", "prefill_s": "slm_prefill_chunk_seconds_sum",
                 "cpu_s": "process_cpu_seconds_total"}


def engine_counters(url: str) -> dict:
    """ENGINE_SERIES read from a `slm serve`'s /metrics now (totals since it started)."""
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        values = {line.split()[0]: float(line.split()[1]) for line in r.read().decode().splitlines()
                  if line and not line.startswith("#")}
    return {key: values.get(name, 0.0) for key, name in ENGINE_SERIES.items()}


def engine_share(before: dict, after: dict, wall_s: float) -> dict:
    """What the engine did between two engine_counters: decode steps, their mean rows and
    compositions, the share of the wall time in decode steps and in prefill (the rest:
    admission, waiting, HTTP), and the server process's CPU seconds (all its threads: on a
    loaded machine less stretched than the wall time)."""
    d = {k: after[k] - before[k] for k in ENGINE_SERIES}
    steps = d["steps"] or 1.0
    return {"steps": int(d["steps"]), "rows_per_step": round(d["rows"] / steps, 2),
            "compositions_per_step": round(d["compositions"] / steps, 2),
            "prefill_chunks": int(d["prefill_chunks"]), "decode_share": round(d["step_s"] / wall_s, 3),
            "prefill_share": round(d["prefill_s"] / wall_s, 3), "cpu_s": round(d["cpu_s"], 2)}
