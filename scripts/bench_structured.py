"""The cost of grammar-constrained decoding (docs/serve.md, "Structured output") on SmolLM2.

Greedy decode rate of one sequence free against one under a JSON schema, and the aggregate
rate of a batch of 8 free rows against 8 rows of which 4 are constrained, through the
generation core `slm serve` runs (slm.model.generation). The schema forces a long answer (an
array of at least LONG items), so constrained rows run every step as the free ones do.
No row stops at an end-of-generation token (every row runs every step). Samples interleave the
configurations; medians of --runs.

    python scripts/bench_structured.py [--steps 64] [--runs 3]
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()

    import numpy as np
    import smollm2_path

    import slm
    from slm.model.generation import decode, first_token, new_sequence, prefill_next
    from slm.model.kernels import default_kernels
    from slm.model.sampling import Sampler
    from slm.model.stops import StopRules
    from slm.ops.request import ResponseFormat
    from slm.ops.structured import grammar_for, processors_for

    store = slm.Store.init(Path(tempfile.mkdtemp()) / "store")
    store.import_base(smollm2_path.locate(), name="smol")
    store.activate("smol")
    loaded = slm.Runtime(store).stage(store.compose("smol"))
    tok = loaded.tokenizer
    grammar = grammar_for(loaded, ResponseFormat.from_schema(SCHEMA))
    prompts = [tok.encode(f"{PROMPT} ({i + 1})") for i in range(8)]
    kernels = default_kernels()

    def sample(constrained: list[bool]) -> float:
        seqs = []
        for ids, c in zip(prompts, constrained):
            seq = new_sequence(loaded.model, ids, Sampler(), StopRules((), a.steps + 2), len(ids) + a.steps + 3,
                               processors_for(loaded, grammar) if c else ())
            logits = None
            while logits is None:
                logits = prefill_next(seq, 512)
            first_token(seq, logits)
            seqs.append(seq)
        started = time.perf_counter()
        for _ in range(a.steps):
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                decode(seqs, kernels)
        assert not any(s.done for s in seqs), "a row ended early: the figures would not compare"
        return len(seqs) * a.steps / (time.perf_counter() - started)

    configs = {"one_free": [False], "one_constrained": [True], "eight_free": [False] * 8,
               "eight_half_constrained": [True, False] * 4}
    got: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(a.runs):
        for name, rows in configs.items():
            got[name].append(sample(rows))
    figures = {k: round(statistics.median(v), 2) for k, v in got.items()}
    figures["ratio_one"] = round(figures["one_constrained"] / figures["one_free"], 3)
    figures["ratio_eight"] = round(figures["eight_half_constrained"] / figures["eight_free"], 3)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
