"""`slm run` and the Python API's generation: one sequence, a batch of one for the step-wise
generator (slm.engine.generation) that `slm serve` drives for many.

The prompt is prefilled in chunks of PREFILL_CHUNK positions. Why chunks: `slm serve`
interleaves a long prompt's prefill with the decode steps of the requests already running (one
chunk between two steps), and a prompt prefilled in chunks does not give bit for bit the logits
of one whole pass (the kernels' float sums run in another order: the last bits differ).
Prefilling the same chunks here keeps `slm run` and the server's answers identical token for
token."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from slm.model.decoder import Decoder
from slm.engine.generation import (LogitProcessor, Sequence, TokenLogprob, decode, first_token, new_sequence,
                                   prefill_next)
from slm.engine.prompt_cache import PromptCache
from slm.engine.sampling import Sampler
from slm.engine.stops import CANCELLED, LENGTH, StopRules

PREFILL_CHUNK = 512  # positions a prefill pass takes at most (`slm serve --prefill-chunk`)


@dataclass
class TokenGeneration:
    """What one generate() call produced, token by token: the ids, the logits kept, why it
    stopped and how long prefill and decode took (slm.ops.infer.run builds the public
    slm.Generation from it)."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # generated tokens
    logits: list[np.ndarray] = field(default_factory=list)  # rows (V,) when kept
    logprobs: list[TokenLogprob] = field(default_factory=list)  # each answer token's, when asked
    stop_reason: str = LENGTH  # slm.engine.stops' reasons, or what the caller's on_token said
    prefix_hit: bool = False  # the prompt's keys/values came from the prefix cache
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stop_cut: str | None = None  # stopped by a stop sequence: the text before it
    text: str | None = None  # the answer's text (None: generated without the tokenizer's decode)

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
             prompt_cache: PromptCache | None = None, comp_id: str = "",
             decode_text: Callable[[list[int]], str] | None = None,
             on_text: Callable[[str], None] | None = None, stop_sequences: tuple[str, ...] = (),
             processors: tuple[LogitProcessor, ...] = (), logprobs: int | None = None,
             cancelled: Callable[[], bool] | None = None) -> TokenGeneration:
    """on_token(id) may return a stop reason (a string) to end generation after that token;
    cancelled(), asked before each chunk of the prompt, ends it before its first token
    (CANCELLED) once it says so: a long prompt's prefill stops within a chunk.
    prompt_cache: consulted under comp_id (the composition's id) when all prompt logits are
    not wanted. decode_text: the tokenizer's decode, to stream the answer's text to on_text
    (and to find stop_sequences in it). processors: slm.engine.generation's logit processors.
    logprobs: None, or record each answer token's logprob and its k alternatives'."""
    capacity = min(model.cfg.context_length, len(prompt_ids) + max_tokens)
    stops = StopRules(eos_ids, max_tokens, decode_text, stop_sequences, on_text, caller=on_token)
    seq = new_sequence(model, prompt_ids, sampler, stops, capacity, processors, keep_logits, logprobs)
    return drive(seq, prompt_cache, comp_id, cancelled)


def drive(seq: Sequence, prompt_cache: PromptCache | None = None, comp_id: str = "",
          cancelled: Callable[[], bool] | None = None) -> TokenGeneration:
    """Run one sequence to its end, a batch of one: its prompt in chunks of PREFILL_CHUNK (or
    from the prompt cache, under comp_id, unless every position's logits are kept), then one
    decode step a token (raising the NumericsError of non-finite logits). cancelled(), asked
    before each chunk of the prompt, ends it before its first token (CANCELLED) once it says so."""
    gen = TokenGeneration(list(seq.prompt_ids))
    use_cache = prompt_cache is not None and not seq.keep_logits
    started = time.perf_counter()
    logits = prompt_cache.get(comp_id, seq.prompt_ids, seq.cache) if use_cache else None
    gen.prefix_hit = logits is not None
    while logits is None:
        if cancelled is not None and cancelled():
            gen.stop_reason, gen.prefill_s = CANCELLED, time.perf_counter() - started
            return gen
        logits = prefill_next(seq, PREFILL_CHUNK)
    if use_cache and not gen.prefix_hit:
        prompt_cache.put(comp_id, seq.prompt_ids, seq.cache, logits)
    gen.prefill_s = time.perf_counter() - started
    started = time.perf_counter()
    first_token(seq, logits)
    while not seq.done:
        error = decode([seq], seq.model.kernels)[0]
        if error is not None:
            raise error
    gen.decode_s = time.perf_counter() - started
    gen.ids, gen.logits, gen.stop_reason, gen.logprobs = seq.ids, seq.kept, seq.reason, seq.token_logprobs
    if seq.stops.cut is not None:
        gen.stop_cut = seq.stops.text
    if seq.stops.stream is not None:
        gen.text = seq.stops.text
    return gen


def sequence_logits(model: Decoder, ids: np.ndarray, prompt_length: int | None = None) -> np.ndarray:
    """The logits (T, V) of every position of `ids` as generate computes them when ids[:prompt_length]
    is the prompt and the rest its answer: the prompt prefilled in chunks of PREFILL_CHUNK, then
    one decode step per answer token (None: all of `ids` is the prompt). Bit for bit the rows a
    generation sampled from: a one-token step and a prompt's pass add in another order, which
    the int8 mode's rounding of each product's input turns into whole quantization steps."""
    T = len(ids)
    prompt = T if prompt_length is None else prompt_length
    cache = model.new_cache(T)
    out = np.empty((T, model.cfg.vocab_size), dtype=np.float32)
    for start in range(0, prompt, PREFILL_CHUNK):
        end = min(prompt, start + PREFILL_CHUNK)
        out[start:end] = model.forward(ids[start:end], cache, "all")
    for i in range(prompt, T):
        out[i] = model.forward(ids[i:i + 1], cache, "last")[0]
    return out

