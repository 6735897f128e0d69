"""Choosing the next token from logits: greedy, or temperature + top-p with a seeded RNG.

`check_sampling` is the one check of the sampling options: `slm run`, the Python API and the
server's requests all pass through it (Sampler itself calls it), so no value it accepts can
fail in the sampler.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from slm.errors import InvalidInput

MAX_SEED = 2**63 - 1


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_sampling(temperature, top_p, seed, max_temperature: float = math.inf) -> None:
    """Raise InvalidInput (one line naming the option) unless temperature is a finite number
    in [0, max_temperature] (the server takes OpenAI's range), top_p a number in (0, 1] and
    seed an integer in [0, MAX_SEED]."""
    if not (_real(temperature) and math.isfinite(temperature) and 0 <= temperature <= max_temperature):
        bounds = "a finite number >= 0" if math.isinf(max_temperature) else f"between 0 and {max_temperature:g}"
        raise InvalidInput(f"temperature must be {bounds}, not {temperature!r}")
    if not (_real(top_p) and 0 < top_p <= 1):
        raise InvalidInput(f"top_p must be a number in (0, 1], not {top_p!r}")
    if not (isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED):
        raise InvalidInput(f"seed must be an integer between 0 and {MAX_SEED}, not {seed!r}")


class Sampler:
    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        check_sampling(temperature, top_p, seed)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.rng = np.random.Generator(np.random.PCG64(int(seed)))

    def __call__(self, logits: np.ndarray) -> int:
        """logits (V,), finite -> a token id."""
        if self.temperature <= 0:
            return int(np.argmax(logits))
        wide = logits.astype(np.float64)
        # (l - max) / T: every exponent is <= 0 and the largest is exactly 0, so the sum is >= 1
        # whatever T. Dividing l by T first overflows to inf for a tiny T (1e-308: inf - inf is
        # NaN). A T so small that the others' exponents reach -inf leaves weight on the largest
        # logits alone: greedy, a tie between maxima drawn at random.
        with np.errstate(over="ignore", under="ignore"):
            probs = np.exp((wide - wide.max()) / self.temperature)
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
