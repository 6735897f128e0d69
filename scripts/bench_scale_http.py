"""The HTTP figures of scripts/bench_scale.py: `slm serve` on one and on four compositions
against `llama-server -np 8` on the same file (the requests: scripts/bench_http.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import bench_peers
from bench_common import PROMPT, SETTLE_S, med


def serve_figures(label: str, gguf: Path, store_root: Path, adapters: list[str], work: Path, a, batch: int) -> dict:
    """`batch` concurrent greedy completions over HTTP (a short text prompt each, --batch-steps
    tokens; a sample sends them again until it has lasted --serve-seconds): `slm serve` on the
    base, on 4 compositions (the base and each LoRA, by spec), and `llama-server` with `batch`
    slots on the same file; aggregate tok/s (bench_http). In each run one server at a time,
    each configuration warmed first by its own requests (staging, the int8 copies, its prompts'
    prefill: every configuration is then timed warm, whatever ran before it), then
    --serve-samples samples of each, one and four compositions taking turns (a change of load
    hits both alike); medians over every run's samples, and the median of the ratios four / one
    of the samples taken side by side. Each slm sample keeps what the server's engine did
    meanwhile (bench_http.engine_share: steps, rows and compositions a step, the time in decode
    steps and in prefill)."""
    from bench_http import concurrent_completions, engine_counters, engine_share, llama_server, slm_serve

    prompts = [f"{PROMPT} Chapter {i + 1}." for i in range(batch)]
    four = ["base"] + [f"base+{x}" for x in adapters]
    configs = {"slm serve|http8": ["active"] * batch,
               "slm serve|http8 on 4 compositions": [four[i % 4] for i in range(batch)]}
    samples: dict = {}

    def add(key: str, url: str, models: list[str], engine: bool) -> None:
        time.sleep(SETTLE_S)
        load = os.getloadavg()[0]
        before = engine_counters(url) if engine else None
        rounds = []  # batch requests at a time, again until --serve-seconds have passed
        while not rounds or sum(r["wall_s"] for r in rounds) < a.serve_seconds:
            rounds.append(concurrent_completions(url, models, prompts, a.batch_steps))
        wall = sum(r["wall_s"] for r in rounds)
        sample = {"value": sum(sum(r["tokens"]) for r in rounds) / wall, "tokens": rounds[0]["tokens"],
                  "rounds": len(rounds), "load": round(load, 2)}
        if engine:
            sample["engine"] = engine_share(before, engine_counters(url), wall)
        samples.setdefault(key, []).append(sample)
        print(f"{label}: {key} {sample}", file=sys.stderr, flush=True)

    for _ in range(a.serve_runs):
        with slm_serve(store_root, max_batch=batch) as url:
            for models in configs.values():
                concurrent_completions(url, models, prompts, a.batch_steps)
            for _ in range(a.serve_samples):
                for key, models in configs.items():
                    add(key, url, models, engine=True)
        with llama_server(bench_peers.tool("llama-server"), gguf, batch, max(256, 64 + a.batch_steps),
                          bench_peers.THREADS, work / "llama-server.log") as url:
            concurrent_completions(url, ["base"] * batch, prompts, a.batch_steps)
            for _ in range(a.serve_samples):
                add("llama-server -np 8|http8", url, ["base"] * batch, engine=False)
    one, on_four = samples["slm serve|http8"], samples["slm serve|http8 on 4 compositions"]
    return {"tok_s": {k: med([s["value"] for s in v]) for k, v in samples.items()},
            "four_over_one": med([f["value"] / o["value"] for o, f in zip(one, on_four)]),
            "load_median": med([s["load"] for v in samples.values() for s in v]), "samples": samples}
