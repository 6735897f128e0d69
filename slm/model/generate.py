"""Prefill the prompt in chunks of PREFILL_CHUNK positions, then decode token by token.

Why chunks: `slm serve` interleaves a long prompt's prefill with the decode steps of the
requests already running (one chunk between two steps), and a prompt prefilled in chunks
does not give bit for bit the logits of one whole pass (the kernels' float sums run in
another order: the last bits differ). Prefilling the same chunks here keeps `slm run` and the
server's answers identical token for token."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from slm.errors import NumericsError
from slm.model.decoder import Decoder
from slm.model.sampling import Sampler

PREFILL_CHUNK = 512  # positions a prefill pass takes at most (`slm serve --prefill-chunk`)


def prefill_chunk(model: Decoder, prompt_ids: list[int], cache, logits_for: str = "last",
                  chunk: int = PREFILL_CHUNK) -> np.ndarray:
    """Run the next chunk of the prompt (positions cache.length..) and return its logits
    (forward's: (1, V) for "last", (T, V) for "all")."""
    start = cache.length
    return model.forward(np.asarray(prompt_ids[start:start + chunk]), cache, logits_for)


def prefill(model: Decoder, prompt_ids: list[int], cache, logits_for: str = "last",
            chunk: int | None = None) -> np.ndarray:
    """The whole prompt, chunk by chunk from position 0 (chunk None: PREFILL_CHUNK): the logits
    of its last position (1, V), or of every position (T, V) with "all"."""
    chunk = chunk or PREFILL_CHUNK
    parts = []
    while cache.length < len(prompt_ids):
        parts.append(prefill_chunk(model, prompt_ids, cache, logits_for, chunk))
    return parts[-1] if logits_for != "all" else np.concatenate(parts)


@dataclass
class TokenGeneration:
    """What one generate() call produced, token by token: the ids, the logits kept, why it
    stopped and how long prefill and decode took (slm.ops.run builds the public
    slm.Generation from it)."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # generated tokens
    logits: list[np.ndarray] = field(default_factory=list)  # rows (V,) when kept
    stop_reason: str = "length"  # "eos", "length", "context", or what a callback said
    prefix_hit: bool = False  # the prompt's keys/values came from the prefix cache
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def prefill_tok_s(self) -> float:
        return len(self.prompt_ids) / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        # the first generated token comes from the prefill; decode steps produce the rest
        steps = max(len(self.ids) - 1, 0)
        return steps / self.decode_s if self.decode_s else 0.0


def generate(model: Decoder, prompt_ids: list[int], max_tokens: int, sampler: Sampler,
             eos_ids: frozenset[int], keep_logits: bool = False,
             on_token: Callable[[int], str | None] | None = None,
             prefix_cache=None) -> TokenGeneration:
    """on_token(id) may return a stop reason (a string) to end generation early.
    prefix_cache: an object with get(tokens, kv) -> last logits | None and put(tokens, kv,
    logits), consulted when all prompt logits are not wanted."""
    gen = TokenGeneration(list(prompt_ids))
    capacity = min(model.cfg.context_length, len(prompt_ids) + max_tokens)
    cache = model.new_cache(capacity)
    use_cache = prefix_cache is not None and not keep_logits
    started = time.perf_counter()
    cached = prefix_cache.get(prompt_ids, cache) if use_cache else None
    if cached is not None:
        logits, gen.prefix_hit = cached[None, :], True  # (1, V)
    else:
        logits = prefill(model, prompt_ids, cache, "all" if keep_logits else "last")
        if use_cache:
            prefix_cache.put(prompt_ids, cache, logits[-1])
    gen.prefill_s = time.perf_counter() - started
    _check_finite(logits[-1])
    if keep_logits:
        gen.logits.extend(logits)
    started = time.perf_counter()
    while len(gen.ids) < max_tokens:
        token = sampler(logits[-1])
        gen.ids.append(token)
        reason = on_token(token) if on_token else None
        if reason:
            gen.stop_reason = reason
            break
        if token in eos_ids:
            gen.stop_reason = "eos"
            break
        if len(gen.ids) == max_tokens:
            break
        if cache.length >= cache.capacity:
            gen.stop_reason = "context"
            break
        logits = model.forward(np.asarray([token]), cache, "last")
        _check_finite(logits[-1])
        if keep_logits:
            gen.logits.append(logits[-1])
    gen.decode_s = time.perf_counter() - started
    return gen


def _check_finite(row: np.ndarray) -> None:
    """Sampling from NaN or inf logits picks token 0 silently; refuse instead (exit 10). Weights
    are checked finite at import and activation, so this catches overflow in the arithmetic."""
    if not np.isfinite(row).all():
        raise NumericsError("the model produced non-finite logits (an overflow in this "
                            "composition's arithmetic); try a smaller adapter weight")
