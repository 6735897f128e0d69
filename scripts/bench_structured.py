"""The cost of grammar-constrained decoding (docs/serve.md, "Structured output"): issue 31's
speed figures, `scripts/bench.py --only structured` (or this file alone).

Greedy decode rate of one sequence free against one under a JSON schema, and the aggregate
rate of a batch of 8 free rows against 8 rows of which 4 are constrained, through the
generation core `slm serve` runs (slm.engine.generation: new_sequence, prefill_next,
first_token, decode), with the grammar masks the server, `slm run --json-schema` and
Session.generate use (slm.engine.structured.grammar_masks). The schema forces a long answer (an
array of at least LONG items), so no row stops early: every row runs every step. Each sample
is timed twice: wall clock and the CPU time of this process (time.process_time; the kernels
run on one thread), the second being what a machine shared with other work can still measure;
the configurations interleave in A/B pairs, order alternating, medians of --runs. Also the
time of the masks themselves (GrammarMask calls) per constrained row and step.

    python scripts/bench_structured.py [--steps 64] [--runs 5] [--bases smollm2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

LONG = 400
SCHEMA = {"type": "array", "items": {"enum": ["alpha", "beta", "gamma"]}, "minItems": LONG}
PROMPT = "List some Greek letters as a JSON array:"
CONFIGS = {"one_free": [False], "one_constrained": [True], "eight_free": [False] * 8,
           "eight_half_constrained": [True, False] * 4}
PAIRS = (("one_free", "one_constrained"), ("eight_free", "eight_half_constrained"))


def bench_structured(loaded, steps: int, runs: int, log=print) -> dict:
    """The figures on one staged composition (slm.api.Runtime.stage), in its kernels' mode."""
    from slm.engine.generation import decode, first_token, new_sequence, prefill_next
    from slm.engine.grammar import GrammarMask
    from slm.engine.sampling import Sampler
    from slm.engine.stops import StopRules
    from slm.engine.request import ResponseFormat
    from slm.engine.structured import grammar_for, grammar_masks

    tok, model = loaded.tokenizer, loaded.model
    model.kernels.set_threads(1)
    grammar = grammar_for(loaded, ResponseFormat.from_schema(SCHEMA))
    prompts = [tok.encode(f"{PROMPT} ({i + 1})") for i in range(8)]
    mask_s = [0.0, 0]  # seconds inside GrammarMask calls, calls
    call = GrammarMask.__call__

    def timed_call(self, ids, logits):
        t = time.perf_counter()
        try:
            return call(self, ids, logits)
        finally:
            mask_s[0] += time.perf_counter() - t
            mask_s[1] += 1

    def sample(constrained: list[bool]) -> tuple[float, float]:
        seqs = []
        for ids, c in zip(prompts, constrained):
            seq = new_sequence(model, ids, Sampler(), StopRules((), steps + 2), len(ids) + steps + 3,
                               grammar_masks(loaded, grammar, steps + 2) if c else ())
            logits = None
            while logits is None:
                logits = prefill_next(seq, 512)
            first_token(seq, logits)
            seqs.append(seq)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            decode(seqs, model.kernels)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert not any(s.done for s in seqs), "a row ended early: the figures would not compare"
        tokens = len(seqs) * steps
        return tokens / wall, tokens / cpu

    GrammarMask.__call__ = timed_call
    try:
        sample(CONFIGS["eight_half_constrained"])  # warm-up: packed copies, the grammar's vocabulary
        mask_s[:] = [0.0, 0]
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in CONFIGS}
        for run in range(runs):
            for pair in PAIRS:
                for name in (pair if run % 2 == 0 else pair[::-1]):
                    got[name].append(sample(CONFIGS[name]))
            log(f"structured: run {run + 1}/{runs} done")
    finally:
        GrammarMask.__call__ = call
    out: dict = {"steps": steps, "runs": runs, "schema": SCHEMA}
    for name, samples in got.items():
        out[name] = {"wall_tok_s": statistics.median(w for w, _ in samples),
                     "cpu_tok_s": statistics.median(c for _, c in samples),
                     "samples": [[round(w, 2), round(c, 2)] for w, c in samples]}
    for free, constrained in PAIRS:
        key = "one" if free.startswith("one") else "eight"
        # the ratio of each A/B pair, then their median (the pair ran back to back)
        out[f"ratio_{key}_wall"] = statistics.median(
            c[0] / f[0] for f, c in zip(got[free], got[constrained]))
        out[f"ratio_{key}_cpu"] = statistics.median(
            c[1] / f[1] for f, c in zip(got[free], got[constrained]))
    out["mask_ms_per_row_step"] = 1000 * mask_s[0] / max(mask_s[1], 1)
    out["decode_ms_per_step_one_free"] = 1000 / out["one_free"]["cpu_tok_s"]
    return out


def print_table(base: str, r: dict) -> None:
    print(f"| {base}, greedy, {r['steps']} steps | free tok/s (CPU) | constrained tok/s (CPU) | ratio CPU (wall) |")
    print("|---|---:|---:|---:|")
    print(f"| one sequence | {r['one_free']['cpu_tok_s']:.1f} | {r['one_constrained']['cpu_tok_s']:.1f} | "
          f"{r['ratio_one_cpu']:.3f} ({r['ratio_one_wall']:.3f}) |")
    print(f"| batch of 8, 4 constrained | {r['eight_free']['cpu_tok_s']:.1f} | "
          f"{r['eight_half_constrained']['cpu_tok_s']:.1f} | {r['ratio_eight_cpu']:.3f} ({r['ratio_eight_wall']:.3f}) |")
    print(f"\nmask: {r['mask_ms_per_row_step']:.3f} ms per constrained row and step "
          f"(one free decode step: {r['decode_ms_per_step_one_free']:.1f} ms of CPU)")


def bench_base(store_root: Path, base: str, steps: int, runs: int) -> dict:
    """The figures of a stored base alone, in the default mode (what a server computes in)."""
    import slm
    from slm.model import modes

    store = slm.Store.open(store_root)
    runtime = slm.Runtime(store, threads=1)
    loaded = runtime.stage(store.compose(base))
    modes.use(loaded.model.kernels, runtime.mode)
    return {"mode": runtime.mode, **bench_structured(
        loaded, steps, runs, log=lambda m: print(f"{base}: {m}", file=sys.stderr, flush=True))}


def run_bases(bases: list[str], steps: int, runs: int) -> dict:
    """Import each base into a scratch store and measure it."""
    import gemma3_path
    import smollm2_path

    import slm

    locate = {"smollm2": smollm2_path.locate, "gemma3": gemma3_path.locate}
    results = {}
    for base in bases:
        gguf = locate[base]()
        if gguf is None:
            results[base] = {"skipped": "not installed"}
            continue
        store = slm.Store.init(Path(tempfile.mkdtemp(prefix=f"slm-bench-structured-{base}-")) / "store")
        store.import_base(gguf, name=base)
        results[base] = bench_base(store.root, base, steps, runs)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--bases", default="smollm2")
    a = p.parse_args()
    results = run_bases(a.bases.split(","), a.steps, a.runs)
    print(json.dumps(results, indent=2))
    for base, r in results.items():
        if "skipped" not in r:
            print_table(base, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
