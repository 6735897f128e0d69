"""Golden answers: the greedy tokens a composition gives to fixed prompts, generated through the
engine as `slm run` generates (slm.ops.infer.run.generate_on), recorded in a verify certificate
and compared by the health check of a composition (slm.ops.infer.health).

Generated in the exact mode (float32 products), the one whose results do not depend on the
machine's kernels beyond float32 rounding (docs/numerics.md), and with every position's logits
kept, so the prompt cache is neither read nor written: a damaged or planted cache entry cannot
answer for the model, and nothing is written to the store.
"""

from __future__ import annotations

import numpy as np

from slm.engine.request import GenerationRequest
from slm.errors import NumericsError
from slm.model import modes
from slm.ops.infer.loading import Loaded
from slm.store import StoreDir

PROMPTS = ("The capital of France is", "def fibonacci(n):")
TOKENS = 8  # per prompt: enough for an adapter that changes the answer to show
MAX_RECORDED = 16  # golden answers a certificate may ask to regenerate


def generate(store: StoreDir, loaded: Loaded, prompt: str, max_tokens: int, mode: str) -> list[int]:
    """The greedy tokens of `prompt`; NumericsError when the logits turn non-finite or all equal
    (the engine's own check at each step), or when any kept row of logits is not finite."""
    from slm.ops.infer.run import RunOptions, generate_on

    options = RunOptions(GenerationRequest(prompt=prompt, max_tokens=max_tokens, temperature=0.0, seed=0),
                         exact=mode == modes.EXACT)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # overflow is reported, not warned
        result, logits = generate_on(store, loaded, options, keep_logits=True)
        if logits is not None and not np.isfinite(logits).all():
            raise NumericsError("the model produced non-finite logits")
    return list(result.tokens)


def answers(store: StoreDir, loaded: Loaded) -> list[dict]:
    """[{"prompt", "tokens"}] for every golden prompt (what a certificate records)."""
    return [{"prompt": p, "tokens": generate(store, loaded, p, TOKENS, modes.EXACT)} for p in PROMPTS]


def differences(store: StoreDir, loaded: Loaded, recorded: object) -> str | None:
    """Why the composition's answers differ from the recorded ones (None: every one matches)."""
    if not isinstance(recorded, list) or not recorded:
        return "the certificate records no golden answers"
    if len(recorded) > MAX_RECORDED:
        return f"the certificate records more than {MAX_RECORDED} golden answers"
    for entry in recorded:
        prompt = entry.get("prompt") if isinstance(entry, dict) else None
        tokens = entry.get("tokens") if isinstance(entry, dict) else None
        if not isinstance(prompt, str) or not isinstance(tokens, list) or len(tokens) > TOKENS \
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            return "the certificate's golden answers are malformed"
        got = generate(store, loaded, prompt, len(tokens) or TOKENS, modes.EXACT)
        if got != tokens:
            at = next((i for i, (a, b) in enumerate(zip(got, tokens)) if a != b), min(len(got), len(tokens)))
            return f"the answer to {prompt[:40]!r} differs from the certified one at token {at}"
    return None
