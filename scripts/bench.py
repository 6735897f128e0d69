"""Benchmarks: slm against llama.cpp (llama-cpp-python) and transformers + PEFT, in one run.

    python scripts/bench.py [--runs 5] [--decode 128] [--prefill 512] [--out docs]

Workloads on each base (--bases: SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M), base and a LoRA r=16 on q,k,v,o,gate,up,down
(scripts/make_random_lora.py; the same adapter as a GGUF LoRA for llama.cpp): decode tok/s
(greedy, fixed token count), prefill tok/s (a prompt of --prefill tokens), LoRA overhead,
switch latency (in-process Runtime warm and cold; wall time of `slm activate`), import
throughput, peak RSS, and the batching of `slm serve` (aggregate decode tok/s of 8 sequences
decoded together in one step, on one composition and on 4, against one alone; in-process,
through the server's batched step; `--batching-only` runs just that). slm runs twice: as it
does by default, and as "slm int8" with the opt-in int8 activations (--activations int8),
whose logits error against the default is measured too (int8_error). Each system runs in a worker process of its own (no thread pool or
environment setting of one can slow another; slm's sets one OpenBLAS thread, torch's two),
driven by this process one request at a time (SETTLE_S of quiet before each), so the
systems are interleaved run by run and never run at once; medians of --runs (every sample
in throughput_samples). Peers that are not installed are skipped and said
so. Writes docs/bench.json; prints the Markdown tables that docs/benchmarks.md quotes.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
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

import gemma3_path  # noqa: E402
import make_random_lora  # noqa: E402
import smollm2_path  # noqa: E402

PROMPT = "Once upon a time, in a small village,"
# Seconds between one worker's answer and the next request: a system's idle threads spin on
# the cores for a while after its last operation (torch's and llama.cpp's OpenMP-style pools,
# slm's OpenMP team): measured, the first ~0.3 s of an slm decode right after a torch
# product burst ran at half speed. Each request starts on quiet cores.
SETTLE_S = 1.0


def med(xs):
    return statistics.median(xs) if xs else None


class SlmSystem:
    name = "slm"
    activations = "float32"

    def __init__(self, plan: dict):
        import slm
        from slm.ops.staging import StagedCompositions
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


class Worker:
    def __init__(self, name: str, plan_path: Path):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", name, "--plan", str(plan_path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} worker exited ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, **req) -> float:
        time.sleep(SETTLE_S)
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()["value"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


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
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a.worker, a.plan)
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


# base -> (GGUF locator, make_random_lora shape arguments, GGUF LoRA architecture, heads, kv heads)
BASES = {
    "smollm2": (smollm2_path.locate, {}, "llama", 9, 3),
    "gemma3": (gemma3_path.locate, make_random_lora.GEMMA3_270M, "gemma3", 4, 1),
}


def bench_base(base: str, a) -> dict:
    from slm.ops.activation import activate
    from slm.ops.importing import import_adapter, import_base
    from slm.ops.loading import load_base_model
    from slm.store import init_store

    locate, lora_shape, lora_arch, n_heads, n_kv_heads = BASES[base]
    gguf = locate()
    if gguf is None:
        print(f"{base}: its GGUF is not installed; skipped", file=sys.stderr)
        return {"skipped": "not installed"}
    work = Path(tempfile.mkdtemp(prefix=f"slm-bench-{base}-"))
    results: dict = {"gguf": gguf.name}
    store, _ = init_store(work / "store")
    t = time.perf_counter()
    imp = import_base(store, gguf, base)
    results["import_mb_s"] = imp.total_bytes / 2**20 / (time.perf_counter() - t)
    peft_dir = make_random_lora.make_random_lora(work / "lora16", rank=16, alpha=32.0, std=0.02, **lora_shape)
    import_adapter(store, peft_dir, "lora16")
    for seed, name in ((1, "lora16b"), (2, "lora16c")):  # the batching figure's other compositions
        import_adapter(store, make_random_lora.make_random_lora(work / name, rank=16, alpha=32.0, std=0.02,
                                                                seed=seed, **lora_shape), name)
    results["batching"] = bench_batching(store, base, ["lora16", "lora16b", "lora16c"], a)
    if a.kernels == "default":
        results["batching_int8"] = bench_batching(store, base, ["lora16", "lora16b", "lora16c"], a, "int8")
    results["batching_http"] = bench_serve_http(store.root, base, ["lora16", "lora16b", "lora16c"], a)
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

    samples: dict = {}
    for run in range(a.runs):
        for w in workers:
            for which in ("base", "lora"):
                samples.setdefault((w.name, which, "decode"), []).append(w.ask(op="decode", which=which, n=a.decode))
                samples.setdefault((w.name, which, "prefill"), []).append(w.ask(op="prefill", which=which))
        print(f"{base}: run {run + 1}/{a.runs} done", file=sys.stderr, flush=True)
    for w in workers:
        w.close()
    table = {f"{k[0]}|{k[1]}|{k[2]}": med(v) for k, v in samples.items()}
    results["throughput_tok_s"] = table
    results["throughput_samples"] = {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in samples.items()}  # the spread
    results["skipped"] = skipped

    from slm.ops.staging import StagedCompositions

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


def lora_overhead_ab(rt, comp_ids: dict, prompt: list, blocks: int = 40, steps: int = 10,
                     activations: str = "float32") -> dict:
    """The LoRA's decode overhead, interleaved in one process (the honest measure: the bench
    medians compare runs minutes apart): blocks of `steps` greedy decode steps alternate
    between the base and the LoRA composition, both staged; the 20th percentile of each side's
    block times (the quietest blocks) gives the overhead."""
    models = {w: rt.switch(comp_ids[w]).model for w in ("base", "lora")}
    for m in models.values():
        m.kernels.set_activations(activations)
    state = {}
    for w, m in models.items():
        cache = m.new_cache(len(prompt) + blocks * steps + 1)
        state[w] = (cache, int(np.argmax(m.forward(np.asarray(prompt), cache, "last")[-1])))
    times: dict = {"base": [], "lora": []}
    for i in range(2 * blocks):
        w = ("base", "lora")[i % 2]
        m, (cache, token) = models[w], state[w]
        t = time.perf_counter()
        for _ in range(steps):
            token = int(np.argmax(m.forward(np.asarray([token]), cache, "last")[-1]))
        times[w].append((time.perf_counter() - t) / steps)
        state[w] = (cache, token)
    p20 = {w: float(np.percentile(v, 20)) for w, v in times.items()}
    for m in models.values():
        m.kernels.set_activations("float32")
    return {"base_ms_per_token": p20["base"] * 1e3, "lora_ms_per_token": p20["lora"] * 1e3,
            "overhead": p20["lora"] / p20["base"] - 1, "blocks": blocks, "steps_per_block": steps}


def int8_error(rt, comp_ids: dict, tok, positions: int = 96, greedy: int = 64) -> dict:
    """What the opt-in int8 activations cost in fidelity, on this base, base and LoRA: a fixed
    text fed one token at a time (every product then takes int8 inputs) in both modes, the
    largest logit difference against the default and against the logits' spread (max - min),
    how often the top token agrees; and how many of `greedy` greedy tokens after PROMPT are the
    same text."""
    text = tok.encode(" ".join(["The quick brown fox jumps over the lazy dog while the farmer "
                                "counts his sheep in the morning light."] * 8))[:positions]
    out = {}
    for which in ("base", "lora"):
        m = rt.switch(comp_ids[which]).model
        logits, tokens = {}, {}
        for mode in ("float32", "int8"):
            m.kernels.set_activations(mode)
            cache = m.new_cache(len(text))
            logits[mode] = np.concatenate([m.forward(np.asarray([t]), cache, "last") for t in text])  # (P, V)
            ids = tok.encode(PROMPT)
            cache = m.new_cache(len(ids) + greedy)
            last = m.forward(np.asarray(ids), cache, "last")[-1]
            tokens[mode] = []
            for _ in range(greedy):
                tokens[mode].append(int(np.argmax(last)))
                last = m.forward(np.asarray([tokens[mode][-1]]), cache, "last")[-1]
        m.kernels.set_activations("float32")
        f, q = logits["float32"], logits["int8"]
        diff = np.abs(q - f).max(axis=1)  # (P,)
        spread = f.max(axis=1) - f.min(axis=1)
        same = next((i for i, (x, y) in enumerate(zip(tokens["float32"], tokens["int8"])) if x != y), greedy)
        out[which] = {"positions": len(text), "max_abs_logit_diff": float(diff.max()),
                      "median_abs_logit_diff": float(np.median(diff)),
                      "max_diff_over_spread": float((diff / spread).max()),
                      "top1_agreement": float(np.mean(f.argmax(1) == q.argmax(1))),
                      "greedy_tokens_identical": same, "greedy_tokens": greedy}
    print(f"int8 activations' error: {out}", file=sys.stderr, flush=True)
    return out


def interleaved_medians(sample, rounds: int, configs: dict) -> dict:
    """{name: median of `rounds` sample(config)}, the configurations taking turns in each round:
    the host's speed drifts within a minute, and a ratio of figures sampled minutes apart
    measures the drift as much as the batching."""
    samples: dict = {name: [] for name in configs}
    for _ in range(rounds):
        for name, config in configs.items():
            samples[name].append(sample(config))
    return {name: med(values) for name, values in samples.items()}


def bench_batching(store, base: str, adapters: list[str], a, activations: str = "float32") -> dict:
    """Aggregate decode tok/s of 8 sequences decoded together (slm.model.batch.decode_step, the
    step `slm serve` runs), on one composition and on 4 (the base and three LoRAs r=16), against
    one sequence alone (Decoder.forward token by token, as `slm run`). Each sample: 8 short
    prompts prefilled, then --batch-steps greedy steps; medians of min(--runs, 3) samples
    (interleaved_medians).
    activations: the kernels' mode for every product (both sides of each ratio)."""
    from slm.model.batch import Row, decode_step
    from slm.model.kernels import default_kernels
    from slm.ops import compositions
    from slm.ops.staging import StagedCompositions

    rt = StagedCompositions(store)
    loaded = [rt.stage(compositions.build(store, base, spec)) for spec in ([], *([x] for x in adapters))]
    kernels = default_kernels()
    for k in (kernels, *(x.model.kernels for x in loaded)):
        k.set_activations(activations)
    tok = loaded[0].tokenizer
    prompts = [tok.encode(f"{PROMPT} Chapter {i + 1}.") for i in range(8)]

    def sample(models) -> float:
        caches = [m.model.new_cache(len(p) + a.batch_steps + 1) for m, p in zip(models, prompts)]
        last = [int(np.argmax(m.model.forward(np.asarray(p), c, "last")[-1])) for m, p, c in zip(models, prompts, caches)]
        t = time.perf_counter()
        for _ in range(a.batch_steps):
            if len(models) == 1:
                logits = models[0].model.forward(np.asarray([last[0]]), caches[0], "last")
            else:
                logits = decode_step([Row(m.model, c, x) for m, c, x in zip(models, caches, last)], kernels)
            last = [int(np.argmax(row)) for row in logits]
        return len(models) * a.batch_steps / (time.perf_counter() - t)

    figures = interleaved_medians(sample, min(a.runs, 3), {
        "one_base": [loaded[0]], "one_lora": [loaded[1]], "eight_base": [loaded[0]] * 8,
        "eight_on_4_compositions": [loaded[i % 4] for i in range(8)]})
    figures["ratio_eight_base"] = figures["eight_base"] / figures["one_base"]
    figures["ratio_eight_on_4_compositions"] = figures["eight_on_4_compositions"] / figures["one_base"]
    print(f"{base}: batching ({activations}) {figures}", file=sys.stderr, flush=True)
    return figures


def bench_serve_http(store_root: Path, base: str, adapters: list[str], a) -> dict:
    """The same through a real `slm serve` (HTTP, JSON, the scheduler): tokens per second of
    one greedy /v1/completions request alone, of 8 at once on the active composition, and of
    8 at once on 4 compositions (named by spec); end to end (short prompts: the prefill is a
    small part); medians of min(--runs, 3), interleaved (interleaved_medians)."""
    import threading
    import urllib.request

    slm_cli(store_root, "activate", base)
    proc = subprocess.Popen([sys.executable, "-m", "slm", "--store", str(store_root), "serve", "--port", "0",
                             "--max-batch", "8"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stderr:
            if "listening on " in line:
                url = line.split("listening on ")[1].split()[0]
                break
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep the pipe drained

        def ask(model: str, i: int, out: list) -> None:
            body = json.dumps({"model": model, "prompt": f"{PROMPT} Chapter {i + 1}.",
                               "max_tokens": a.batch_steps}).encode()
            req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                out.append(json.loads(r.read())["usage"]["completion_tokens"])

        def sample(models: list[str]) -> float:
            out: list = []
            threads = [threading.Thread(target=ask, args=(m, i, out)) for i, m in enumerate(models)]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            return sum(out) / (time.perf_counter() - t)

        specs = [base] + [f"{base}+{x}" for x in adapters]
        sample(specs)  # stage the compositions, warm the prompt cache
        figures = interleaved_medians(sample, min(a.runs, 3), {
            "one": ["active"], "eight": ["active"] * 8, "eight_on_4_compositions": [specs[i % 4] for i in range(8)]})
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    figures["ratio_eight"] = figures["eight"] / figures["one"]
    figures["ratio_eight_on_4_compositions"] = figures["eight_on_4_compositions"] / figures["one"]
    print(f"{base}: slm serve over HTTP {figures}", file=sys.stderr, flush=True)
    return figures


def print_tables(results: dict) -> None:
    print(f"CPU: {results['machine']['cpu']} ({results['machine']['cpus']} cores)")
    for base, r in results["bases"].items():
        print(f"\n### {base}\n")
        if "skipped" in r and "throughput_tok_s" not in r:
            print(f"skipped: {r['skipped']}")
            continue
        print_base_tables(r)


def print_base_tables(r: dict) -> None:
    for key, mode in (("batching", ""), ("batching_int8", " (int8 activations)")):
        if r.get(key):
            print_batching(r[key], r.get("batching_http") if key == "batching" else None, mode)
    if "throughput_tok_s" not in r:
        return
    print_throughput(r)


def print_batching(b: dict, h: dict | None, mode: str) -> None:
    if b:
        print(f"| decode (slm serve's batched step){mode} | aggregate tok/s | vs one request alone |")
        print("|---|---:|---:|")
        print(f"| one request, base | {b['one_base']:.1f} | 1.00 |")
        print(f"| one request, LoRA r=16 | {b['one_lora']:.1f} | {b['one_lora'] / b['one_base']:.2f} |")
        print(f"| 8 requests, base | {b['eight_base']:.1f} | {b['ratio_eight_base']:.2f} |")
        print(f"| 8 requests on 4 compositions (base + 3 LoRAs) | {b['eight_on_4_compositions']:.1f} | "
              f"{b['ratio_eight_on_4_compositions']:.2f} |")
        if h:
            print(f"| through `slm serve` (HTTP): one / 8 / 8 on 4 compositions | {h['one']:.1f} / {h['eight']:.1f} / "
                  f"{h['eight_on_4_compositions']:.1f} | {h['ratio_eight']:.2f} / "
                  f"{h['ratio_eight_on_4_compositions']:.2f} |")
        print()


def print_throughput(r: dict) -> None:
    t = r["throughput_tok_s"]
    names = sorted({k.split("|")[0] for k in t}, key=lambda n: (not n.startswith("slm"), n))
    ours = [n for n in names if n.startswith("slm")]
    print("| system | decode base | decode LoRA | prefill base | prefill LoRA | LoRA decode overhead |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in names:
        db, dl, pb, pl = (t[f"{n}|{w}|{k}"] for k, w in
                          (("decode", "base"), ("decode", "lora"), ("prefill", "base"), ("prefill", "lora")))
        print(f"| {n} | {db:.1f} | {dl:.1f} | {pb:.0f} | {pl:.0f} | {100 * (db / dl - 1):.1f}% |")
    print("\nslm's speed over each peer's (slm / peer; > 1 means slm is faster):\n")
    print("| slm mode / peer | decode base | decode LoRA | prefill base | prefill LoRA |")
    print("|---|---:|---:|---:|---:|")
    for mine in ours:
        for n in (n for n in names if n not in ours):
            cells = [t[f"{mine}|{w}|{k}"] / t[f"{n}|{w}|{k}"] for k, w in
                     (("decode", "base"), ("decode", "lora"), ("prefill", "base"), ("prefill", "lora"))]
            print(f"| {mine} / {n} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    for key, mode in (("lora_overhead_ab", ""), ("lora_overhead_ab_int8", ", int8 activations")):
        ab = r.get(key)
        if ab:
            print(f"\nLoRA decode overhead{mode}, interleaved in-process A/B ({ab['blocks']} blocks of "
                  f"{ab['steps_per_block']} steps each, 20th percentile): {100 * ab['overhead']:.1f}% "
                  f"({ab['base_ms_per_token']:.2f} vs {ab['lora_ms_per_token']:.2f} ms per token)")
    for which, e in (r.get("int8_error") or {}).items():
        print(f"\nint8 activations vs float32, {which}, {e['positions']} positions one token at a time: "
              f"largest |logit difference| {e['max_abs_logit_diff']:.3f} (median {e['median_abs_logit_diff']:.3f}; "
              f"at most {100 * e['max_diff_over_spread']:.2f}% of the logits' spread), top token agrees at "
              f"{100 * e['top1_agreement']:.1f}% of positions, greedy text identical for "
              f"{e['greedy_tokens_identical']} of {e['greedy_tokens']} tokens")
    s = r["switch_s"]
    print(f"\nswitch: in-process warm {s['in_process_warm'] * 1e3:.3f} ms, in-process cold (stage the "
          f"adapter) {s['in_process_cold_adapter'] * 1e3:.1f} ms, `slm activate` wall "
          f"{s['slm_activate_wall'] * 1e3:.0f} ms")
    rss, est = r["peak_rss_bytes"], r["memory_estimate_bytes"]
    print(f"import: {r['import_mb_s']:.0f} MB/s; peak RSS base {rss['base'] / 2**20:.0f} MiB "
          f"(estimate {est['base'] / 2**20:.0f}), LoRA {rss['lora'] / 2**20:.0f} MiB (estimate "
          f"{est['lora'] / 2**20:.0f}); skipped: {r['skipped'] or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
