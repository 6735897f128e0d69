"""Choosing the next token from logits: greedy, or temperature with top-k, min-p and top-p
filters and a seeded RNG; and the checks of every sampling option.

`check_sampling` (temperature, top_p, seed) and `check_processing` (top_k, min_p, the
penalties, logit_bias, logprobs, n) are the one check of the sampling options: `slm run`, the
Python API and the server's requests all pass through them (Sampler itself calls
check_sampling), so no value they accept can fail in the sampler or a processor.

Seeds: a request that gives none gets a fresh one from the operating system's randomness
(`random_seed`), reported with its answer so that it can be reproduced; choice i of a request
with n choices and seed s uses s + i (`choice_seeds`).
"""

from __future__ import annotations

import math
import numbers
import secrets

import numpy as np

from slm.errors import InvalidInput

MAX_SEED = 2**63 - 1
MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs
MAX_PENALTY = 2.0  # OpenAI's range for frequency_penalty and presence_penalty: -2..2
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value: -100..100


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_sampling(temperature, top_p, seed, max_temperature: float = math.inf) -> None:
    """Raise InvalidInput (one line naming the option) unless temperature is a finite number
    in [0, max_temperature] (the server takes OpenAI's range), top_p a number in (0, 1] and
    seed an integer in [0, MAX_SEED] or None (a fresh random seed)."""
    if not (_real(temperature) and math.isfinite(temperature) and 0 <= temperature <= max_temperature):
        bounds = "a finite number >= 0" if math.isinf(max_temperature) else f"between 0 and {max_temperature:g}"
        raise InvalidInput(f"temperature must be {bounds}, not {temperature!r}")
    if not (_real(top_p) and 0 < top_p <= 1):
        raise InvalidInput(f"top_p must be a number in (0, 1], not {top_p!r}")
    if seed is not None and not (_whole(seed) and 0 <= seed <= MAX_SEED):
        raise InvalidInput(f"seed must be an integer between 0 and {MAX_SEED}, not {seed!r}")


def check_processing(top_k=0, min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0, repeat_penalty=1.0,
                     logit_bias=None, logprobs=None, n=1, max_n: int | None = None,
                     vocab_size: int | None = None, logprobs_name: str = "logprobs", stop=(),
                     repetition_penalty=1.0) -> None:
    """Raise InvalidInput (one line naming the option) unless top_k is an integer >= 0 (0: off),
    min_p in [0, 1], frequency_penalty and presence_penalty in [-2, 2], repeat_penalty a finite
    number > 0 (1: off; so is repetition_penalty, and at most one of them is on), logit_bias a
    mapping of token ids to numbers in [-100, 100] (ids below
    vocab_size when it is known), logprobs None or an integer in [0, 20] (how many
    alternatives per token; logprobs_name: the request's name for it, chat's top_logprobs),
    n an integer in [1, max_n] and stop one stop sequence or at most 4 (stop_sequences), each of
    1 to 256 characters."""
    if not (_whole(top_k) and top_k >= 0):
        raise InvalidInput(f"top_k must be an integer >= 0 (0: no limit), not {top_k!r}")
    if not (_real(min_p) and 0 <= min_p <= 1):
        raise InvalidInput(f"min_p must be a number in [0, 1], not {min_p!r}")
    for name, value in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
        if not (_real(value) and -MAX_PENALTY <= value <= MAX_PENALTY):
            raise InvalidInput(f"{name} must be a number between -2 and 2, not {value!r}")
    for name, value in (("repeat_penalty", repeat_penalty), ("repetition_penalty", repetition_penalty)):
        if not (_real(value) and math.isfinite(value) and value > 0):
            raise InvalidInput(f"{name} must be a finite number > 0 (1: off), not {value!r}")
    if repeat_penalty != 1 and repetition_penalty != 1:
        raise InvalidInput("give repeat_penalty (the answer's tokens) or repetition_penalty (the prompt's and the "
                           "answer's), not both")
    check_logit_bias(logit_bias, vocab_size)
    if logprobs is not None and not (_whole(logprobs) and 0 <= logprobs <= MAX_TOP_LOGPROBS):
        raise InvalidInput(f"{logprobs_name} must be an integer between 0 and {MAX_TOP_LOGPROBS}, not {logprobs!r}")
    if not (_whole(n) and n >= 1):
        raise InvalidInput(f"n must be an integer >= 1, not {n!r}")
    if max_n is not None and n > max_n:
        raise InvalidInput(f"n is {n}; this server decodes at most {max_n} choices of one request together "
                           "(its --max-batch)")
    check_stop(stop_sequences(stop))


MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_STOP_CHARS = 256


def stop_sequences(stop) -> tuple:
    """OpenAI's stop as a tuple of sequences: None none, a string one sequence (never its
    characters), a list or tuple its items; anything else as given, for check_stop to refuse."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    return tuple(stop) if isinstance(stop, (list, tuple)) else stop


def check_stop(stop) -> None:
    """stop: a sequence of at most MAX_STOP strings of 1 to MAX_STOP_CHARS characters each."""
    if isinstance(stop, str) or not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InvalidInput("stop must be a string or a list of strings")
    if len(stop) > MAX_STOP:
        raise InvalidInput(f"stop takes at most {MAX_STOP} sequences, not {len(stop)}")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stop):
        raise InvalidInput(f"each stop sequence must have 1 to {MAX_STOP_CHARS} characters")


def check_logit_bias(logit_bias, vocab_size: int | None = None) -> None:
    """logit_bias: None or {token id: bias in [-100, 100]}; ids as integers or their decimal
    strings (JSON's keys), in [0, vocab_size) when vocab_size is given."""
    if logit_bias is None:
        return
    if not isinstance(logit_bias, dict):
        raise InvalidInput("logit_bias must be an object mapping token ids to numbers")
    for key, bias in logit_bias.items():
        token = _token_id(key)
        if token is None or token < 0 or (vocab_size is not None and token >= vocab_size):
            limit = "" if vocab_size is None else f" below {vocab_size}"
            raise InvalidInput(f"logit_bias: {key!r} is not a token id (an integer >= 0{limit})")
        if not (_real(bias) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
            raise InvalidInput(f"logit_bias[{key}] must be a number between -100 and 100, not {bias!r}")
    banned = {_token_id(k) for k, b in logit_bias.items() if b <= -MAX_LOGIT_BIAS}
    if vocab_size is not None and len(banned) >= vocab_size:
        raise InvalidInput("logit_bias bans every token of the vocabulary (-100 bans a token)")


def _token_id(key) -> int | None:
    if _whole(key):
        return int(key)
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    return None


def logit_bias_items(logit_bias) -> tuple[tuple[int, float], ...]:
    """A checked logit_bias as sorted (token id, bias) pairs (hashable, one order)."""
    return tuple(sorted((_token_id(k), float(v)) for k, v in (logit_bias or {}).items()))


def random_seed() -> int:
    """A fresh seed from the operating system's randomness, in [0, MAX_SEED]."""
    return secrets.randbelow(MAX_SEED + 1)


def choice_seeds(seed: int | None, n: int) -> tuple[int, ...]:
    """The seed of each of n choices: seed + i when a seed is given (InvalidInput if the last
    passes MAX_SEED), else a fresh random seed each."""
    if seed is None:
        return tuple(random_seed() for _ in range(n))
    if seed + n - 1 > MAX_SEED:
        raise InvalidInput(f"seed {seed} with n={n}: choice i uses seed + i, which passes {MAX_SEED}")
    return tuple(seed + i for i in range(n))


class Sampler:
    """temperature 0: greedy (the filters change nothing). Else the probabilities at that
    temperature, filtered in this order (llama.cpp's and vLLM's): top_k (the k most likely;
    0 keeps all), min_p (those with at least min_p times the top probability), top_p (the
    smallest most-likely set whose mass reaches top_p); then one draw from the seeded RNG."""

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = 0, top_k: int = 0,
                 min_p: float = 0.0):
        check_sampling(temperature, top_p, seed)
        check_processing(top_k=top_k, min_p=min_p)
        self.seed = random_seed() if seed is None else int(seed)
        self.temperature = float(temperature)
        self.top_p, self.top_k, self.min_p = float(top_p), int(top_k), float(min_p)
        self.rng = np.random.Generator(np.random.PCG64(self.seed))

    def __call__(self, logits: np.ndarray) -> int:
        """logits (V,), finite (a processor's bias may have set some to -inf) -> a token id."""
        if self.temperature <= 0:
            return int(np.argmax(logits))
        wide = logits.astype(np.float64)
        # (l - max) / T: every exponent is <= 0 and the largest is exactly 0, so the sum is >= 1
        # whatever T. Dividing l by T first overflows to inf for a tiny T (1e-308: inf - inf is
        # NaN). A T so small that the others' exponents reach -inf leaves weight on the largest
        # logits alone: greedy, a tie between maxima drawn at random.
        with np.errstate(over="ignore", under="ignore"):
            probs = np.exp((wide - wide.max()) / self.temperature)  # (a banned token's -inf: 0)
        if 0 < self.top_k < probs.size:
            kth = np.partition(probs, probs.size - self.top_k)[probs.size - self.top_k]
            probs[probs < kth] = 0.0  # (ties with the k-th kept: the same set whatever the order)
        if self.min_p > 0:
            probs[probs < self.min_p * probs.max()] = 0.0
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
