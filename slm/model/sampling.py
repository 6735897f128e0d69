"""Choosing the next token from logits: greedy, or temperature + top-p with a seeded RNG."""

from __future__ import annotations

import numpy as np


class Sampler:
    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        self.temperature = temperature
        self.top_p = top_p
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def __call__(self, logits: np.ndarray) -> int:
        """logits (V,) -> a token id."""
        if self.temperature <= 0:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / self.temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if self.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            # keep the smallest prefix whose mass reaches top_p (at least one token)
            keep = order[: int(np.searchsorted(cumulative, self.top_p)) + 1]
            mask = np.zeros_like(probs)
            mask[keep] = probs[keep]
            probs = mask / mask.sum()
        return int(self.rng.choice(probs.size, p=probs))
