"""The benchmark at deployment sizes: slm against llama.cpp's own tools, on the same GGUF files.

    python scripts/bench_scale.py [--models smollm2-q4_1,...] [--runs 3] [--decode 128] [--prefill 512]

For each file (MODELS: the bundled SmolLM2 Q4_1 and its Q4_0 requantization, Gemma 3 270M
Q4_K_M, and random-weight files with the shapes of Llama 3.2 1B and Llama 3.1 8B written by
scripts/make_shape_gguf.py; made once into .peers/models): decode tok/s (-n 128 from an empty
context for llama-bench, 128 greedy steps after an 8-token prompt for slm), prefill tok/s of a
512-token prompt, and aggregate decode tok/s of 8 sequences decoded together (slm's batched
step, the one `slm serve` runs, against llama-batched-bench -npl 8; and in the default mode the
same 8 on one LoRA r=16 and on 4 compositions: the base and three random LoRAs r=16,
scripts/bench_scale_lora.py; these three figures --batch-pairs times each per batched run,
taking turns, and their ratios as medians of each round's).
After the worker, the LoRA r=16's decode overhead: --lora-processes A/Bs, base and LoRA
alternating, each in a worker process started for it. Then the HTTP figures (--serve-runs,
--serve-samples, --serve-seconds): 8
concurrent completions through `slm serve` (on the base, and on the 4 compositions, taking
turns) and through `llama-server -np 8` on the same file (scripts/bench_http.py). slm runs in its exact mode
and its default (int8) one, in a worker process of its own (the mechanism of
scripts/bench.py); llama-bench runs once (-r 1) per sample; every sample is preceded by
SETTLE_S of quiet, the systems take turns within each run, and the tables give medians. The
machine's read bandwidth with the same 2 threads (scripts/read_bandwidth.c) is sampled in
every run too, so that the decode figures can be read as a share of it. Each sample records
the 1-minute load average. Writes the "scale" section of docs/bench.json after each model (the
rest of the file, and the models not measured in this run, are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the `slm` command sets it (slm/entry.py)

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_import  # noqa: E402
import bench_peers  # noqa: E402
import bench_scale_http  # noqa: E402
import bench_scale_lora  # noqa: E402
import gemma3_path  # noqa: E402
import smollm2_path  # noqa: E402
from bench_common import SETTLE_S, WorkerProcess, cpu_kind, cpu_model, med  # noqa: E402

MODELS_DIR = bench_peers.PEERS / "models"
BATCH = 8  # sequences decoded together
BATCH_PROMPT = 16  # tokens of each batched sequence's prompt
LORA_AB_STEPS = 8  # decode steps of one block of the LoRA A/B
# the batched figures of the default mode a round of --batch-pairs takes, in turn: (key, worker op)
BATCH_TRIPLE = [("slm int8|batch8", "batched"), ("slm int8|batch8 on one LoRA", "batched_lora"),
                ("slm int8|batch8 on 4 compositions", "batched4")]


def shape_gguf(shape: str, qtype: str) -> Path | None:
    """A random-weight GGUF with the dims of a real model (scripts/make_shape_gguf.py), made once."""
    maker = HERE / "make_shape_gguf.py"
    if not maker.exists():
        return None
    out = MODELS_DIR / f"{shape}-{qtype.lower()}.gguf"
    if not out.exists():
        MODELS_DIR.mkdir(parents=True, exist_ok=True)
        part = out.with_name(out.name + ".part")  # an interrupted run leaves no half file behind
        subprocess.run([sys.executable, str(maker), str(part), "--shape", shape, "--type", qtype], check=True)
        part.rename(out)
    return out


def smollm2_q4_0() -> Path | None:
    src = smollm2_path.locate()
    if src is None:
        return None
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    return bench_peers.requantize(src, MODELS_DIR / "smollm2-135m-q4_0.gguf", "Q4_0")


# label -> (what it is, how to get the file: a Path, or None when it cannot be had here)
MODELS = {
    "smollm2-q4_1": ("SmolLM2 135M Q4_1 (bundled)", smollm2_path.locate),
    "smollm2-q4_0": ("SmolLM2 135M Q4_0 (requantized)", smollm2_q4_0),
    "gemma3-q4_k_m": ("Gemma 3 270M Q4_K_M", gemma3_path.locate),
    "llama1b-q4_0": ("Llama 3.2 1B shape, Q4_0", lambda: shape_gguf("llama-3.2-1b", "Q4_0")),
    "llama1b-q4_k_m": ("Llama 3.2 1B shape, Q4_K_M", lambda: shape_gguf("llama-3.2-1b", "Q4_K_M")),
    "llama8b-q4_0": ("Llama 3.1 8B shape, Q4_0", lambda: shape_gguf("llama-3.1-8b", "Q4_0")),
}


def streamed_bytes(gguf: Path) -> int:
    """Bytes of weights one decode step reads: every tensor, except the token embedding table
    when the file has its own output matrix (then only one row of the table is read)."""
    import gguf as gguf_py

    tensors = {t.name: int(t.n_bytes) for t in gguf_py.GGUFReader(str(gguf)).tensors}
    total = sum(tensors.values())
    return total - tensors.get("token_embd.weight", 0) if "output.weight" in tensors else total


class SlmScaleWorker:
    """In the worker process: the base staged once; decode, prefill and the batched step in
    either mode (set per request, as `--exact` sets it per run)."""

    def __init__(self, plan: dict):
        import slm
        from slm.ops.infer import compositions
        from slm.ops.infer.staging import StagedCompositions
        from slm.store import StoreDir

        slm.keep_freed_memory()  # as `slm run` does
        store = StoreDir(Path(plan["store"]))
        self.rt = StagedCompositions(store)
        self.comp_ids = {"base": plan["comp_id"], "lora": plan["lora_comp_id"]}
        # the 4 compositions of 8-on-4 (base, and each LoRA alone), staged once, sharing the base's map
        self.four = [self.rt.stage(compositions.build(store, "base", spec)).model
                     for spec in ([], *([x] for x in plan["adapters"]))]
        self.loaded = self.rt.switch(plan["comp_id"])
        self.model = self.loaded.model
        self.short, self.long = plan["short"], plan["long"]

    def _mode(self, mode: str):
        for m in (self.model, *self.four):
            m.kernels.set_activations(mode)
        return self.model

    def decode(self, mode: str, n: int) -> float:
        m = self._mode(mode)
        cache = m.new_cache(len(self.short) + n)
        logits = m.forward(np.asarray(self.short), cache, "last")
        t = time.perf_counter()
        for _ in range(n):
            logits = m.forward(np.asarray([int(np.argmax(logits[-1]))]), cache, "last")
        return n / (time.perf_counter() - t)

    def prefill(self, mode: str, n: int) -> float:
        m = self._mode(mode)
        ids = self.long[:n]
        t = time.perf_counter()
        m.forward(np.asarray(ids), m.new_cache(len(ids)), "last")
        return len(ids) / (time.perf_counter() - t)

    def batched(self, mode: str, n: int) -> float:
        """Aggregate decode tok/s of BATCH sequences on the base through slm.model.batch.decode_step
        (the step `slm serve` runs), each after its own BATCH_PROMPT-token prompt; only the steps
        are timed, as llama-batched-bench's speed_tg."""
        return self._batch(mode, n, [self._mode(mode)] * BATCH)

    def batched_lora(self, mode: str, n: int) -> float:
        """batched, the BATCH sequences on one LoRA r=16 composition: every row pays the LoRA's
        own terms, read once for all of them (the cost of the LoRA, apart from mixing)."""
        self._mode(mode)
        return self._batch(mode, n, [self.four[1]] * BATCH)

    def batched4(self, mode: str, n: int) -> float:
        """batched, the BATCH sequences on 4 compositions: the base and three LoRAs r=16 (two
        rows each, interleaved), each row adding its own composition's terms in the same step."""
        self._mode(mode)
        return self._batch(mode, n, [self.four[i % len(self.four)] for i in range(BATCH)])

    def lora_ab(self, mode: str, n: int) -> dict:
        """The LoRA r=16's decode overhead in this process (bench_inprocess.lora_overhead_ab:
        blocks of LORA_AB_STEPS steps, base and LoRA taking turns), n tokens a side."""
        from bench_inprocess import lora_overhead_ab

        blocks = max(1, n // LORA_AB_STEPS)
        out = lora_overhead_ab(self.rt, self.comp_ids, self.short, blocks, LORA_AB_STEPS, activations=mode)
        self.rt.switch(self.comp_ids["base"])
        return out

    def _batch(self, mode: str, n: int, models: list) -> float:
        from slm.model.batch import Row, decode_step

        prompts = [self.long[i * BATCH_PROMPT:(i + 1) * BATCH_PROMPT] for i in range(BATCH)]
        caches = [m.new_cache(BATCH_PROMPT + n + 1) for m in models]
        last = [int(np.argmax(m.forward(np.asarray(p), c, "last")[-1])) for m, p, c in zip(models, prompts, caches)]
        t = time.perf_counter()
        for _ in range(n):
            logits = decode_step([Row(m, c, x) for m, c, x in zip(models, caches, last)], models[0].kernels)
            last = [int(np.argmax(row)) for row in logits]
        return BATCH * n / (time.perf_counter() - t)


def worker(plan_path: Path, lora_only: bool) -> int:
    """A JSON request per line on stdin ({"op", "mode", "n"}), a JSON answer per line on stdout.
    lora_only: warmed for the LoRA A/B alone (int8, the base and the LoRA)."""
    w = SlmScaleWorker(json.loads(plan_path.read_text()))
    if lora_only:
        w.prefill("int8", 64), w.lora_ab("int8", 2 * LORA_AB_STEPS)
    else:
        for mode in ("float32", "int8"):  # warm-up: the pages mapped, the scratch allocated
            w.prefill(mode, 64), w.decode(mode, 4)
        w.batched4("int8", 2), w.batched_lora("int8", 2)  # and the 4 compositions' int8 factors and packed rows built
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        value = getattr(w, req["op"])(req["mode"], req["n"])
        print(json.dumps({"value": value}), flush=True)
    return 0


class Worker(WorkerProcess):
    """The driver's end of the slm worker process (its samples take their quiet in sample())."""

    def __init__(self, plan_path: Path, lora_only: bool = False):
        super().__init__("slm", [sys.executable, __file__, "--worker", "--plan", str(plan_path)] +
                         (["--lora-only"] if lora_only else []))


def sample(fn) -> dict:
    """One figure after SETTLE_S of quiet, with the 1-minute load average when it started."""
    time.sleep(SETTLE_S)
    load = os.getloadavg()[0]
    return {"value": fn(), "load": round(load, 2)}


def bench_model(label: str, gguf: Path, a) -> dict:
    from slm.ops.store.activation import activate
    from slm.store import StoreDir

    bench_peers.PEERS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"scale-{label}-", dir=bench_peers.PEERS))
    try:
        # the import figures first, on a quiet machine; the last import's store is the one measured
        imported, store_root = bench_import.import_and_disk(gguf, work, "base", a.import_runs)
        if a.only == "import":
            return {"import": imported, "import_mb_s": imported["mib_s"]}
        store = StoreDir(store_root)
        adapters = bench_scale_lora.import_loras(store, gguf, work)
        lora_comp_id = activate(store, "base", [adapters[0]]).active.id
        comp_id = activate(store, "base", []).active.id  # the base stays the active composition
        # token ids, not text: the random-weight files' vocabularies say nothing; every vocabulary
        # here has more than 1000 entries
        ids = [int(x) for x in np.random.default_rng(0).integers(10, 1000, size=max(a.prefill, BATCH * BATCH_PROMPT))]
        plan = {"store": str(store.root), "comp_id": comp_id, "lora_comp_id": lora_comp_id, "adapters": adapters,
                "short": ids[:8], "long": ids}
        plan_path = work / "plan.json"
        plan_path.write_text(json.dumps(plan))
        out = measure(label, gguf, Worker(plan_path), a) if a.runs else {}  # --runs 0: LoRA, HTTP, import only
        if a.lora_processes:  # after the worker has gone (never two copies of an 8B model at once)
            out.update(lora_figures(label, plan_path, a))
        out["import"] = imported
        out["import_mb_s"] = imported["mib_s"]  # MiB/s, the key's meaning before "import" had its own section
        if a.serve_runs:  # after the worker has gone: never two copies of an 8B model at once
            out["http"] = bench_scale_http.serve_figures(label, gguf, store.root, adapters, work, a, BATCH)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(label: str, gguf: Path, slm: Worker, a) -> dict:
    samples: dict = {}

    def add(key: str, fn) -> None:
        samples.setdefault(key, []).append(sample(fn))
        print(f"{label}: {key} {samples[key][-1]}", file=sys.stderr, flush=True)

    try:
        for run in range(a.runs):
            add("read_bandwidth_gb_s", lambda: bench_peers.read_bandwidth(repetitions=5)["median_gb_s"])
            for op, n in (("decode", a.decode), ("prefill", a.prefill)):
                add(f"slm|{op}", lambda: slm.ask(op=op, mode="float32", n=n))
                add(f"slm int8|{op}", lambda: slm.ask(op=op, mode="int8", n=n))
                add(f"llama-bench|{op}", lambda: bench_peers.llama_bench(gguf, op, n))
            if run < a.batch_runs:
                add("slm|batch8", lambda: slm.ask(op="batched", mode="float32", n=a.batch_steps))
                # 8 on one, on one LoRA and on 4 compositions: --batch-pairs rounds, the three
                # in each, their order alternated, so that a ratio is never one sample against
                # one other (rounds: their ratios, the median in the table)
                for k in range(a.batch_pairs):
                    for key, op in BATCH_TRIPLE if k % 2 == 0 else BATCH_TRIPLE[::-1]:
                        add(key, lambda: slm.ask(op=op, mode="int8", n=a.batch_steps))
                add("llama-batched-bench|batch8", lambda: bench_peers.llama_batched_bench(
                    gguf, BATCH, BATCH_PROMPT, a.batch_steps)["decode_tok_s"])
            print(f"{label}: run {run + 1}/{a.runs} done", file=sys.stderr, flush=True)
    finally:
        slm.close()
    medians = {k: med([s["value"] for s in v]) for k, v in samples.items()}
    rounds = [dict(zip([key for key, _ in BATCH_TRIPLE], values))
              for values in zip(*(samples.get(key, []) for key, _ in BATCH_TRIPLE))]
    weights = streamed_bytes(gguf)
    out = {"file": gguf.name, "file_bytes": gguf.stat().st_size, "streamed_bytes_per_token": weights,
           "tok_s": medians, "samples": samples,
           "load_median": med([s["load"] for v in samples.values() for s in v])}
    if rounds:  # the median of the ratios of each round's samples, taken seconds apart
        one, lora, four = (key for key, _ in BATCH_TRIPLE)

        def ratio(a: str, b: str) -> float:
            return med([r[a]["value"] / r[b]["value"] for r in rounds])

        out["batch_ratios"] = {"four_over_one": ratio(four, one), "four_over_lora": ratio(four, lora),
                               "lora_over_one": ratio(lora, one), "rounds": len(rounds)}
    bw = medians["read_bandwidth_gb_s"]
    # the share of the read bandwidth a decode rate uses: weight bytes per token x tok/s
    out["bandwidth_share"] = {k.split("|")[0]: weights * v / 1e9 / bw for k, v in medians.items()
                              if k.endswith("|decode")}
    print(f"{label}: {json.dumps(medians)}", file=sys.stderr, flush=True)
    return out


def lora_figures(label: str, plan_path: Path, a) -> dict:
    """The LoRA r=16 decode A/B (bench_inprocess.lora_overhead_ab) in --lora-processes worker
    processes, one after the other, each started for it: within a process base and LoRA take
    turns, and from one process to the next the figure moves by a few percent (why was not
    pinned down), so a process's figure alone says little. The medians of the processes' figures,
    with the lowest and highest overhead; each process's A/B under "samples"."""
    ab = []
    for _ in range(a.lora_processes):
        slm = Worker(plan_path, lora_only=True)
        try:
            ab.append(sample(lambda: slm.ask(op="lora_ab", mode="int8", n=a.lora_tokens)))
        finally:
            slm.close()
        print(f"{label}: slm int8|lora r=16 A/B {ab[-1]}", file=sys.stderr, flush=True)
    figures = {k: med([s["value"][k] for s in ab]) if isinstance(v, float) else v for k, v in ab[0]["value"].items()}
    overheads = [s["value"]["overhead"] for s in ab]
    figures |= {"load": med([s["load"] for s in ab]), "processes": len(ab),
                "overhead_lowest": min(overheads), "overhead_highest": max(overheads)}
    return {"lora_overhead_ab_int8": figures, "lora_samples": ab}


def _measured(path: Path) -> dict:
    """The models of bench.json's "scale" section, as an earlier run wrote them."""
    return json.loads(path.read_text()).get("scale", {}).get("models", {}) if path.exists() else {}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch-runs", type=int, default=2, help="runs that also take the batched figures")
    p.add_argument("--batch-pairs", type=int, default=3,
                   help="in each of those runs, rounds of the int8 8-on-one, 8-on-one-LoRA and 8-on-4 figures, taking turns")
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--batch-steps", type=int, default=32, help="decode steps of each batched sequence")
    p.add_argument("--serve-runs", type=int, default=1,
                   help="runs of the HTTP figures (slm serve, llama-server -np 8; each run starts each server once); 0: none")
    p.add_argument("--serve-samples", type=int, default=7,
                   help="samples of each HTTP figure in a run (one and four compositions taking turns)")
    p.add_argument("--serve-seconds", type=float, default=3.0,
                   help="an HTTP sample repeats its 8 concurrent requests until it has lasted this long")
    p.add_argument("--lora-processes", type=int, default=3,
                   help="LoRA r=16 decode A/Bs, each in a worker process of its own, after the worker; 0: none")
    p.add_argument("--lora-tokens", type=int, default=256, help="decode steps of each side of a LoRA A/B")
    p.add_argument("--import-runs", type=int, default=bench_import.RUNS,
                   help="imports (each into a fresh store) and disk-write samples; the figures are their medians")
    p.add_argument("--only", choices=["import"],
                   help="import: only the import figures and the disk's write bandwidth, merged into each "
                        "model's entry (its other figures kept)")
    p.add_argument("--out", type=Path, default=HERE.parent / "docs")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--lora-only", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve_runs and a.serve_samples < 1:
        p.error("--serve-samples must be at least 1 (or --serve-runs 0: no HTTP figures)")
    if a.worker:
        return worker(a.plan, a.lora_only)
    path = a.out / "bench.json"
    results: dict = {"machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), **cpu_kind()},
                     "peer_build": bench_peers.build_info(), "models": {}}
    for label in a.models.split(","):
        what, locate = MODELS[label]
        gguf = locate()
        if gguf is None:
            print(f"{label}: its file is not available here; skipped", file=sys.stderr)
            entry = {"what": what, "skipped": "file not available"}
        else:
            settings = {k: v for k, v in vars(a).items() if k not in ("worker", "plan", "out", "models")}
            date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            if a.only == "import":  # the model's other figures, from an earlier run, stay as they were
                entry = _measured(path).get(label, {"what": what}) | bench_model(label, gguf, a) | {"import_date": date}
            else:
                entry = {"what": what, "date": date, "settings": settings} | bench_model(label, gguf, a)
        results["models"][label] = entry
        # written after every model, into the models measured before (a long run that stops
        # keeps what it measured; one model can be re-measured alone)
        a.out.mkdir(exist_ok=True)
        doc = json.loads(path.read_text()) if path.exists() else {}
        kept = _measured(path)
        merged = {**kept, **results["models"]}
        order = sorted(merged, key=lambda k: list(MODELS).index(k) if k in MODELS else len(MODELS))
        if a.only == "import" and "peer_build" in doc.get("scale", {}):
            results["peer_build"] = doc["scale"]["peer_build"]  # the peers' figures are the earlier run's
        doc["scale"] = results | {"models": {k: merged[k] for k in order}}
        path.write_text(json.dumps(doc, indent=2) + "\n")
    results = json.loads(path.read_text())["scale"]
    import bench_scale_tables

    bench_scale_tables.print_tables(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
