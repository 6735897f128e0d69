"""Benchmarks: slm against llama.cpp (its own llama-bench, and llama-cpp-python) and transformers + PEFT, in one run.

    python scripts/bench.py [--runs 5] [--decode 128] [--prefill 512] [--out docs]

Workloads on each base (--bases: SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M), base and a LoRA r=16 on q,k,v,o,gate,up,down
(scripts/make_random_lora.py; the same adapter as a GGUF LoRA for llama.cpp): decode tok/s
(greedy, fixed token count), prefill tok/s (a prompt of --prefill tokens), LoRA overhead,
switch latency (in-process Runtime warm and cold; wall time of `slm activate`), import
throughput, peak RSS, and the batching of `slm serve` (aggregate decode tok/s of 8 sequences
decoded together in one step, on one composition and on 4, against one alone; in-process,
through the server's batched step; `--batching-only` runs just that), and the cost of
grammar-constrained decoding (a JSON schema on one row, and on 4 rows of a batch of 8, against
free rows: scripts/bench_structured.py; `--only structured` runs just that), and the cost of vLLM's
router in front of `slm serve` (8 concurrent requests through vllm-router against the same sent
straight to the server: scripts/bench_router.py, which also runs on its own). slm runs twice: as "slm",
its exact mode (`--exact`: float32 products), and as "slm int8", its default mode (integer
products), whose logits error against the exact mode is measured too (int8_error). Each system runs in a worker process of its own (no thread pool or
environment setting of one can slow another; slm's sets one OpenBLAS thread, torch's two),
driven by this process one request at a time (SETTLE_S of quiet before each), so the
systems are interleaved run by run and never run at once; medians of --runs (every sample
in throughput_samples). llama.cpp's own llama-bench (built by `make peers`,
scripts/bench_peers.py) runs as one more system, base only (it takes no LoRA), one repetition
per request. Peers that are not installed are skipped and said so. The same against
llama-bench at deployment sizes (1B and 8B shapes): scripts/bench_scale.py. Writes docs/bench.json; prints the Markdown tables that docs/benchmarks.md quotes.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# What the `slm` command sets for its process (slm/entry.py), before NumPy loads: slm's worker,
# and the in-process figures (batching, LoRA A/B), run as `slm run` does. (llama.cpp and torch
# do not use NumPy's OpenBLAS.)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_import  # noqa: E402
import bench_peers  # noqa: E402
import gemma3_path  # noqa: E402
import make_random_lora  # noqa: E402
import smollm2_path  # noqa: E402
from bench_common import PROMPT, SETTLE_S, WorkerProcess, cpu_kind, cpu_model, med, peak_rss, slm_cli  # noqa: E402
from bench_inprocess import bench_batching, bench_serve_http, int8_error, lora_overhead_ab  # noqa: E402
from bench_router import bench_router  # noqa: E402
import router_peer  # noqa: E402
from bench_tables import print_tables  # noqa: E402


class SlmSystem:
    name = "slm"
    activations = "float32"

    def __init__(self, plan: dict):
        import slm
        from slm.ops.infer.staging import StagedCompositions
        from slm.store import StoreDir

        slm.keep_freed_memory()  # as `slm run` does
        self.rt = StagedCompositions(StoreDir(Path(plan["store"])))
        self.comp_ids = plan["comp_ids"]
        self.kernels = plan["kernels"]

    def _model(self, which):
        loaded = self.rt.switch(self.comp_ids[which])
        if self.kernels == "reference":
            from slm.model.kernels import ReferenceKernels

            loaded.model.kernels = ReferenceKernels()
        loaded.model.kernels.set_activations(self.activations)
        return loaded

    def prefill(self, which, ids):
        m = self._model(which).model
        t = time.perf_counter()
        m.forward(np.asarray(ids), m.new_cache(len(ids)), "last")
        return len(ids) / (time.perf_counter() - t)

    def decode(self, which, ids, n):
        m = self._model(which).model
        cache = m.new_cache(len(ids) + n)
        logits = m.forward(np.asarray(ids), cache, "last")
        t = time.perf_counter()
        for _ in range(n):
            logits = m.forward(np.asarray([int(np.argmax(logits[-1]))]), cache, "last")
        return n / (time.perf_counter() - t)


class SlmInt8System(SlmSystem):
    name = "slm int8"
    activations = "int8"


class LlamaCppSystem:
    name = "llama.cpp"

    def __init__(self, plan: dict):
        from llama_cpp import Llama

        gguf, lora_gguf = plan["gguf"], plan["lora_gguf"]

        self.models = {
            "base": Llama(model_path=str(gguf), n_threads=2, n_ctx=2048, verbose=False),
            "lora": Llama(model_path=str(gguf), lora_path=str(lora_gguf), n_threads=2, n_ctx=2048, verbose=False),
        }

    def prefill(self, which, ids):
        llm = self.models[which]
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        return len(ids) / (time.perf_counter() - t)

    def decode(self, which, ids, n):
        llm = self.models[which]
        llm.reset()
        llm.eval(ids)
        t = time.perf_counter()
        for _ in range(n):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([token])
        return n / (time.perf_counter() - t)


class TransformersSystem:
    name = "transformers+PEFT"

    def __init__(self, plan: dict):
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        gguf, peft_dir = Path(plan["gguf"]), plan["peft_dir"]
        torch.set_num_threads(2)
        self.torch = torch
        load = lambda: AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,  # noqa: E731
                                                            dtype=torch.float32).eval()
        self.models = {"base": load(), "lora": PeftModel.from_pretrained(load(), str(peft_dir)).eval()}

    def prefill(self, which, ids):
        with self.torch.no_grad():
            t = time.perf_counter()
            self.models[which](self.torch.tensor([ids]))
            return len(ids) / (time.perf_counter() - t)

    def decode(self, which, ids, n):
        torch = self.torch
        model = self.models[which]
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=True)
            past, token = out.past_key_values, out.logits[0, -1].argmax()
            t = time.perf_counter()
            for _ in range(n):
                out = model(token.view(1, 1), past_key_values=past, use_cache=True)
                past, token = out.past_key_values, out.logits[0, -1].argmax()
            return n / (time.perf_counter() - t)


SYSTEMS = {c.name: c for c in (SlmSystem, SlmInt8System, LlamaCppSystem, TransformersSystem)}


def worker(name: str, plan_path: Path) -> int:
    """Serve one system: a JSON request per line on stdin, a JSON answer per line on stdout."""
    plan = json.loads(plan_path.read_text())
    try:
        system = SYSTEMS[name](plan)
    except ImportError as err:
        print(json.dumps({"skip": f"not installed ({err.name})"}), flush=True)
        return 0
    short, long_ids = plan["short"], plan["long"]
    system.prefill("base", short), system.decode("base", short, 4), system.decode("lora", short, 4)  # warm-up
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "decode":
            value = system.decode(req["which"], short, req["n"])
        else:
            value = system.prefill(req["which"], long_ids)
        print(json.dumps({"value": value}), flush=True)
    return 0


class LlamaBenchPeer:
    """llama.cpp's own llama-bench, driven like a worker: each request runs it once (-r 1) on the
    base's GGUF with 2 threads. It takes no LoRA, so it answers for the base only."""

    name = "llama-bench"
    takes_lora = False

    def __init__(self, gguf: Path, prefill: int):
        self.gguf, self.prefill = gguf, prefill

    def ask(self, op: str, which: str, n: int | None = None) -> float:
        time.sleep(SETTLE_S)
        return bench_peers.llama_bench(self.gguf, op, n if op == "decode" else self.prefill)

    def close(self) -> None:
        pass


class Worker(WorkerProcess):
    takes_lora = True

    def __init__(self, name: str, plan_path: Path):
        super().__init__(name, [sys.executable, __file__, "--worker", name, "--plan", str(plan_path)], SETTLE_S)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--kernels", default="default", choices=["default", "reference"])
    p.add_argument("--out", type=Path, default=HERE.parent / "docs")
    p.add_argument("--skip-peers", action="store_true")
    p.add_argument("--batching-only", action="store_true", help="only the batched-decode figures")
    p.add_argument("--batch-steps", type=int, default=64, help="decode steps per batching sample")
    p.add_argument("--bases", default="smollm2,gemma3", help="comma-separated: smollm2, gemma3")
    p.add_argument("--only", choices=["structured"],
                   help="structured: only the cost of grammar-constrained decoding (scripts/bench_structured.py)")
    p.add_argument("--structured-steps", type=int, default=64, help="decode steps per structured sample")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a.worker, a.plan)
    if a.only == "structured":
        return bench_structured_only(a)
    import slm

    slm.keep_freed_memory()  # the in-process figures (batching, LoRA A/B) run as `slm serve` does

    results: dict = {"machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), **cpu_kind(),
                                 "python": platform.python_version()},
                     "settings": {k: v for k, v in vars(a).items() if k not in ("worker", "plan")} | {"out": str(a.out)},
                     "bases": {}}
    for base in a.bases.split(","):
        results["bases"][base] = bench_base(base, a)
    a.out.mkdir(exist_ok=True)
    # --batching-only writes beside the full run's figures, never over them
    (a.out / ("bench-batching.json" if a.batching_only else "bench.json")).write_text(json.dumps(results, indent=2) + "\n")
    print_tables(results)
    return 0


def bench_structured_only(a) -> int:
    """`--only structured`: issue 31's speed figures, beside the full run's (never over them)."""
    import bench_structured

    results: dict = {"machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), **cpu_kind(),
                                 "python": platform.python_version(), "load_average": os.getloadavg()},
                     "bases": bench_structured.run_bases(a.bases.split(","), a.structured_steps, a.runs)}
    a.out.mkdir(exist_ok=True)
    (a.out / "bench-structured.json").write_text(json.dumps(results, indent=2) + "\n")
    for base, r in results["bases"].items():
        if "skipped" not in r:
            bench_structured.print_table(base, r)
    return 0


# base -> (GGUF locator, make_random_lora shape arguments, GGUF LoRA architecture, heads, kv heads)
BASES = {
    "smollm2": (smollm2_path.locate, {}, "llama", 9, 3),
    "gemma3": (gemma3_path.locate, make_random_lora.GEMMA3_270M, "gemma3", 4, 1),
}


def bench_base(base: str, a) -> dict:
    from slm.ops.store.activation import activate
    from slm.ops.store.importing import import_adapter
    from slm.ops.infer.loading import load_base_model
    from slm.store import StoreDir

    locate, lora_shape, lora_arch, n_heads, n_kv_heads = BASES[base]
    gguf = locate()
    if gguf is None:
        print(f"{base}: its GGUF is not installed; skipped", file=sys.stderr)
        return {"skipped": "not installed"}
    work = Path(tempfile.mkdtemp(prefix=f"slm-bench-{base}-"))
    results: dict = {"gguf": gguf.name}
    # median of 3 `slm import base` runs into fresh stores, beside the disk's write bandwidth
    # (scripts/bench_import.py); the last import's store is the one measured below
    results["import"], store_root = bench_import.import_and_disk(gguf, work, base)
    results["import_mb_s"] = results["import"]["mib_s"]
    store = StoreDir(store_root)
    peft_dir = make_random_lora.make_random_lora(work / "lora16", rank=16, alpha=32.0, std=0.02, **lora_shape)
    import_adapter(store, peft_dir, "lora16")
    for seed, name in ((1, "lora16b"), (2, "lora16c")):  # the batching figure's other compositions
        import_adapter(store, make_random_lora.make_random_lora(work / name, rank=16, alpha=32.0, std=0.02,
                                                                seed=seed, **lora_shape), name)
    results["batching"] = bench_batching(store, base, ["lora16", "lora16b", "lora16c"], a)
    if a.kernels == "default":
        results["batching_int8"] = bench_batching(store, base, ["lora16", "lora16b", "lora16c"], a, "int8")
    results["batching_http"] = bench_serve_http(store.root, base, ["lora16", "lora16b", "lora16c"], a)
    if router_peer.executable() is not None:  # the router's own cost (a dev-extra peer)
        results["router_http"] = bench_router(store.root, base, min(a.runs, 3), a.batch_steps, work / "router.log")
    if a.kernels == "default":
        import bench_structured

        results["structured"] = bench_structured.bench_base(store.root, base, a.structured_steps, a.runs)
    if a.batching_only:
        return results
    comp_ids = {"base": activate(store, base, []).active.id,
                "lora": activate(store, base, ["lora16"]).active.id}
    tok = load_base_model(store, base).tokenizer
    short = tok.encode(PROMPT)
    filler = tok.encode(" ".join(["The quick brown fox jumps over the lazy dog."] * 80))
    long_ids = filler[: a.prefill]

    plan = {"store": str(store.root), "comp_ids": comp_ids, "kernels": a.kernels, "gguf": str(gguf),
            "peft_dir": str(peft_dir), "short": short, "long": long_ids, "lora_gguf": None}
    names = ["slm"] + (["slm int8"] if a.kernels == "default" else [])
    if not a.skip_peers:
        import make_adapters
        from slm.formats.peft import read_peft_adapter

        plan["lora_gguf"] = str(make_adapters.write_gguf_lora(
            work / "lora16.gguf", read_peft_adapter(peft_dir), alpha=32.0, n_heads=n_heads,
            n_kv_heads=n_kv_heads, arch=lora_arch))
        names += ["llama.cpp", "transformers+PEFT"]
    plan_path = work / "plan.json"
    plan_path.write_text(json.dumps(plan))
    workers, skipped = [], {}
    for name in names:
        w = Worker(name, plan_path)
        if "skip" in w.hello:
            skipped[name] = w.hello["skip"]
            w.close()
        else:
            workers.append(w)
    if not a.skip_peers:
        try:
            bench_peers.tool("llama-bench")
            workers.append(LlamaBenchPeer(gguf, len(long_ids)))
        except FileNotFoundError as err:
            skipped["llama-bench"] = str(err)

    samples: dict = {}
    for run in range(a.runs):
        for w in workers:
            for which in ("base", "lora") if w.takes_lora else ("base",):
                samples.setdefault((w.name, which, "decode"), []).append(w.ask(op="decode", which=which, n=a.decode))
                samples.setdefault((w.name, which, "prefill"), []).append(w.ask(op="prefill", which=which))
        print(f"{base}: run {run + 1}/{a.runs} done", file=sys.stderr, flush=True)
    for w in workers:
        w.close()
    table = {f"{k[0]}|{k[1]}|{k[2]}": med(v) for k, v in samples.items()}
    results["throughput_tok_s"] = table
    results["throughput_samples"] = {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in samples.items()}  # the spread
    results["skipped"] = skipped

    from slm.ops.infer.staging import StagedCompositions

    rt = StagedCompositions(store)
    results["lora_overhead_ab"] = lora_overhead_ab(rt, comp_ids, short)
    if a.kernels == "default":
        results["lora_overhead_ab_int8"] = lora_overhead_ab(rt, comp_ids, short, activations="int8")
        results["int8_error"] = int8_error(rt, comp_ids, tok)
    warm = []
    for _ in range(50):
        t = time.perf_counter()
        rt.switch(comp_ids["base"] if len(warm) % 2 else comp_ids["lora"])
        warm.append(time.perf_counter() - t)
    cold = []
    for _ in range(a.runs):
        fresh = StagedCompositions(store)
        fresh.switch(comp_ids["base"])
        t = time.perf_counter()
        fresh.switch(comp_ids["lora"])
        cold.append(time.perf_counter() - t)
    # `slm activate` as an installed slm starts: from compiled bytecode (pip compiles a package
    # when it installs it; an environment with PYTHONDONTWRITEBYTECODE set, as CI's, would
    # otherwise recompile every module of every run)
    compileall.compile_dir(str(HERE.parent / "slm"), quiet=1)
    cli = []
    for i in range(a.runs * 2):
        cli.append(slm_cli(work / "store", "activate", base, *(["lora16"] if i % 2 else [])))
    results["switch_s"] = {"in_process_warm": med(warm), "in_process_cold_adapter": med(cold),
                           "slm_activate_wall": med(cli)}
    estimates = {}
    for which, adapters in (("base", []), ("lora", ["lora16"])):
        slm_cli(work / "store", "activate", base, *adapters)
        out = subprocess.run([sys.executable, "-m", "slm", "--store", str(work / "store"), "run", "--json",
                              "-n", "16", PROMPT], capture_output=True, text=True, check=True).stdout
        estimates[which] = json.loads(out)["memory_estimate"]["total"]
    results["memory_estimate_bytes"] = estimates
    results["peak_rss_bytes"] = {
        "base": (slm_cli(work / "store", "activate", base),
                 peak_rss(work / "store", "run", PROMPT, "-n", "16"))[1],
        "lora": (slm_cli(work / "store", "activate", base, "lora16"),
                 peak_rss(work / "store", "run", PROMPT, "-n", "16"))[1],
    }
    return results


if __name__ == "__main__":
    sys.exit(main())
