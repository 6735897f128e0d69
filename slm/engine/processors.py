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
- repeat_penalty r (llama.cpp's name, the CTRL paper's definition): each generated token's
  logit is divided by r if it is positive, multiplied by r if not;
- repetition_penalty r (vLLM's): the same rule, over the prompt's tokens and the answer's
  (one RepeatPenalty, given the prompt);
- min_tokens n (vLLM's): while fewer than n tokens are generated, the tokens that would end
  the answer (end-of-generation unless ignore_eos, and the stop token ids) are banned;
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
    def __init__(self, penalty: float, prompt_ids: Iterable[int] = ()):
        self.penalty = float(penalty)
        self.prompt = np.unique(np.asarray(list(prompt_ids), dtype=np.int64))

    def __call__(self, ids: list[int], logits: np.ndarray) -> np.ndarray:
        if not ids and not self.prompt.size:
            return logits
        tokens = np.union1d(self.prompt, np.asarray(ids, dtype=np.int64))
        out = logits.copy()
        # In float64 by the penalty in the row's precision: the row's own rounding of the rule
        # (a float64 quotient of float32 numbers rounds to float32 as a float32 division does)
        seen = out[tokens].astype(np.float64)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            penalty = np.float64(np.asarray(self.penalty, dtype=out.dtype))
            penalised = np.where(seen > 0, seen / penalty, np.where(seen < 0, seen * penalty, seen))
        # A penalty near 0 (or huge) takes a logit past the row's float range: +inf on two
        # tokens is NaN once the sampler subtracts the maximum, and -inf would be a ban, which
        # a penalty is not. The largest finite logit keeps the rule's order of tokens.
        limit = np.finfo(out.dtype).max
        out[tokens] = np.clip(penalised, -limit, limit)
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


class MinTokens:
    """Bans `ending` (token ids) while fewer than `count` tokens are generated."""

    def __init__(self, count: int, ending: Iterable[int]):
        self.count, self.ending = count, np.asarray(sorted(ending), dtype=np.int64)

    def __call__(self, ids: list[int], logits: np.ndarray) -> np.ndarray:
        if len(ids) >= self.count:
            return logits
        out = logits.copy()
        out[self.ending] = -np.inf
        return out


def processors_for(frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_penalty: float = 1.0,
                   logit_bias: Iterable[tuple[int, float]] = (), *, repetition_penalty: float = 1.0,
                   prompt_ids: Iterable[int] = (), min_tokens: int = 0,
                   ending: Iterable[int] = ()) -> tuple[LogitProcessor, ...]:
    """The processors of checked options (slm.engine.sampling.check_processing; at most one of
    repeat_penalty and repetition_penalty is not 1), in the order they run: the repetition
    penalty, frequency/presence, logit_bias (a bias has the last word but one), min_tokens'
    ban of the `ending` tokens (no bias lifts it)."""
    out: list[LogitProcessor] = []
    if repeat_penalty != 1.0:
        out.append(RepeatPenalty(repeat_penalty))
    if repetition_penalty != 1.0:
        out.append(RepeatPenalty(repetition_penalty, prompt_ids))
    if frequency_penalty or presence_penalty:
        out.append(FrequencyPresence(frequency_penalty, presence_penalty))
    bias = tuple(logit_bias)
    if bias:
        out.append(LogitBias(bias))
    ending = tuple(ending)
    if min_tokens and ending:
        out.append(MinTokens(min_tokens, ending))
    return tuple(out)
