"""Logit processors: penalties and a bias applied to a sequence's logits before sampling.

Each is a callable (generated ids, logits row (V,)) -> logits row, as slm.engine.generation's
Sequence runs them in order before its Sampler (slm.engine.sampling: temperature, top_k, min_p,
top_p). The options are checked by slm.engine.sampling.check_processing; `processors_for`
builds the list, empty when every option is off, so a plain request pays nothing.

Which tokens a penalty counts: the answer's so far (not the prompt), as OpenAI and vLLM
define frequency_penalty and presence_penalty; repeat_penalty counts the same tokens (llama.cpp
counts the last 64 tokens, prompt included). Definitions:

- frequency_penalty f, presence_penalty p (OpenAI's): l[t] -= c[t] * f + (c[t] > 0) * p, where
  c[t] is how many times t was generated so far;
- repeat_penalty r (llama.cpp's, the CTRL paper's): each generated token's logit is divided by
  r if it is positive, multiplied by r if not;
- logit_bias {t: b} (OpenAI's): l[t] += b; b = -100 bans t (its logit becomes -inf), b = 100
  forces it wherever it is allowed.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from slm.engine.generation import LogitProcessor

BAN = -100.0  # OpenAI: "-100 should result in a ban"


class FrequencyPresence:
    def __init__(self, frequency: float, presence: float):
        self.frequency, self.presence = float(frequency), float(presence)

    def __call__(self, ids: list[int], logits: np.ndarray) -> np.ndarray:
        if not ids:
            return logits
        tokens, counts = np.unique(np.asarray(ids, dtype=np.int64), return_counts=True)
        out = logits.copy()
        out[tokens] -= (counts * self.frequency + self.presence).astype(out.dtype)
        return out


class RepeatPenalty:
    def __init__(self, penalty: float):
        self.penalty = float(penalty)

    def __call__(self, ids: list[int], logits: np.ndarray) -> np.ndarray:
        if not ids:
            return logits
        tokens = np.unique(np.asarray(ids, dtype=np.int64))
        out = logits.copy()
        seen = out[tokens]
        out[tokens] = np.where(seen > 0, seen / self.penalty, seen * self.penalty)
        return out


class LogitBias:
    def __init__(self, items: Iterable[tuple[int, float]]):
        pairs = list(items)
        self.tokens = np.asarray([t for t, _ in pairs], dtype=np.int64)
        self.bias = np.asarray([b for _, b in pairs], dtype=np.float64)

    def __call__(self, ids: list[int], logits: np.ndarray) -> np.ndarray:
        out = logits.copy()
        out[self.tokens] = (out[self.tokens] + self.bias).astype(out.dtype)
        out[self.tokens[self.bias <= BAN]] = -np.inf
        return out


def processors_for(frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_penalty: float = 1.0,
                   logit_bias: Iterable[tuple[int, float]] = ()) -> tuple[LogitProcessor, ...]:
    """The processors of checked options (slm.engine.sampling.check_processing), in the order
    they run: repeat_penalty, frequency/presence, logit_bias (a bias has the last word)."""
    out: list[LogitProcessor] = []
    if repeat_penalty != 1.0:
        out.append(RepeatPenalty(repeat_penalty))
    if frequency_penalty or presence_penalty:
        out.append(FrequencyPresence(frequency_penalty, presence_penalty))
    bias = tuple(logit_bias)
    if bias:
        out.append(LogitBias(bias))
    return tuple(out)
