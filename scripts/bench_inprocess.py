"""The figures scripts/bench.py measures in its own process: the LoRA overhead A/B, the int8
activations' error, and the batching of `slm serve` (in-process through its batched step, and
over HTTP)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from bench_common import PROMPT, med, slm_cli


def lora_overhead_ab(rt, comp_ids: dict, prompt: list, blocks: int = 40, steps: int = 10,
                     activations: str = "float32") -> dict:
    """The LoRA's decode overhead, interleaved in one process (the honest measure: the bench
    medians compare runs minutes apart): blocks of `steps` greedy decode steps alternate
    between the base and the LoRA composition, both staged; the 20th percentile of each side's
    block times (the quietest blocks) gives the overhead. Both the wall-clock time and this
    process's CPU time (on a loaded machine, run it at one thread and read the CPU time: it
    does not count the time the process was descheduled)."""
    models = {w: rt.switch(comp_ids[w]).model for w in ("base", "lora")}
    for m in models.values():
        m.kernels.set_activations(activations)
    state = {}
    for w, m in models.items():
        cache = m.new_cache(len(prompt) + blocks * steps + 1)
        state[w] = (cache, int(np.argmax(m.forward(np.asarray(prompt), cache, "last")[-1])))
    times: dict = {"base": [], "lora": []}
    cpu: dict = {"base": [], "lora": []}
    for i in range(2 * blocks):
        w = ("base", "lora")[i % 2]
        m, (cache, token) = models[w], state[w]
        t, c = time.perf_counter(), time.process_time()
        for _ in range(steps):
            token = int(np.argmax(m.forward(np.asarray([token]), cache, "last")[-1]))
        times[w].append((time.perf_counter() - t) / steps)
        cpu[w].append((time.process_time() - c) / steps)
        state[w] = (cache, token)
    p20 = {w: float(np.percentile(v, 20)) for w, v in times.items()}
    c20 = {w: float(np.percentile(v, 20)) for w, v in cpu.items()}
    for m in models.values():
        m.kernels.set_activations("float32")
    return {"base_ms_per_token": p20["base"] * 1e3, "lora_ms_per_token": p20["lora"] * 1e3,
            "overhead": p20["lora"] / p20["base"] - 1, "base_cpu_ms_per_token": c20["base"] * 1e3,
            "lora_cpu_ms_per_token": c20["lora"] * 1e3, "overhead_cpu": c20["lora"] / c20["base"] - 1,
            "blocks": blocks, "steps_per_block": steps}


def int8_error(rt, comp_ids: dict, tok, positions: int = 96, greedy: int = 64) -> dict:
    """What the default int8 mode costs in fidelity against the exact one, on this base, base
    and LoRA: a fixed text fed one token at a time (every product then takes int8 inputs) in
    both modes, the largest logit difference against the exact mode and against the logits'
    spread (max - min), how often the top token agrees; and how many of `greedy` greedy tokens
    after PROMPT are the same text."""
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
    from slm.ops.infer import compositions
    from slm.ops.infer.staging import StagedCompositions

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
    from bench_http import concurrent_completions, slm_serve

    slm_cli(store_root, "activate", base)
    with slm_serve(store_root, max_batch=8) as url:
        def sample(models: list[str]) -> float:
            prompts = [f"{PROMPT} Chapter {i + 1}." for i in range(len(models))]
            return concurrent_completions(url, models, prompts, a.batch_steps)["tok_s"]

        specs = [base] + [f"{base}+{x}" for x in adapters]
        sample(specs)  # stage the compositions, warm the prompt cache
        figures = interleaved_medians(sample, min(a.runs, 3), {
            "one": ["active"], "eight": ["active"] * 8, "eight_on_4_compositions": [specs[i % 4] for i in range(8)]})
    figures["ratio_eight"] = figures["eight"] / figures["one"]
    figures["ratio_eight_on_4_compositions"] = figures["eight_on_4_compositions"] / figures["one"]
    print(f"{base}: slm serve over HTTP {figures}", file=sys.stderr, flush=True)
    return figures
