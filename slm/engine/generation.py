"""The step-wise generator: sequences advanced one prefill chunk or one decode step at a time.

`slm run` and the Python API (slm.engine.generate.generate: a batch of one) and `slm serve`
(slm.engine.scheduler: many sequences, prompts taking turns a chunk each between decode steps)
drive the same functions, so a greedy answer is token for token the same wherever it runs:

    seq = new_sequence(model, prompt_ids, sampler, stops, capacity)
    logits = None
    while logits is None:
        logits = prefill_next(seq, chunk)      # one chunk of the prompt
    first_token(seq, logits)                   # sample, apply the stop rules
    while not seq.done:
        decode([seq, ...], kernels)            # one batched step for every running sequence

A sequence may carry logit processors, callables (generated ids, logits row) -> logits row
applied in order before sampling (penalties, a bias, a grammar's mask); the check that the
model's own logits are finite and not all equal (check_finite) runs before them.

A sequence asked for logprobs (k alternatives, 0..20) records, for each answer token (not one
that ends the answer with no text of its own: slm.engine.stops.StopRules.hidden), a
TokenLogprob: the log-softmax, in float64, of the model's own logits for that position (before
the processors and the sampler's temperature and filters: the numbers Session.logits gives,
whatever penalties or bias the request had), and the k most likely tokens with theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from slm.errors import NumericsError
from slm.model.batch import Row, decode_step
from slm.model.decoder import Decoder, KVCache
from slm.engine.sampling import Sampler
from slm.engine.stops import LENGTH, StopRules

LogitProcessor = Callable[[list[int], np.ndarray], np.ndarray]


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the k most likely (id, logprob), most likely first


def token_logprob(logits: np.ndarray, token: int, k: int) -> TokenLogprob:
    """The log-softmax (float64) of a logits row at `token`, and its k most likely entries."""
    wide = logits.astype(np.float64)
    shifted = wide - wide.max()
    logp = shifted - np.log(np.exp(shifted).sum())
    if k:  # (a partition, then a sort of k: not a sort of the whole vocabulary per token)
        part = np.argpartition(-logp, k - 1)[:k] if k < logp.size else np.arange(logp.size)
        top = part[np.lexsort((part, -logp[part]))]  # most likely first; a tie: the lower id first
    else:
        top = np.empty(0, dtype=np.int64)
    return TokenLogprob(int(token), float(logp[token]), tuple((int(t), float(logp[t])) for t in top))


@dataclass(eq=False)
class Sequence:
    """One generation's state: its model (composition), KV cache, sampler, prompt, stop state
    (with the generated ids and text), processors and, if asked, every logits row it produced."""

    model: Decoder
    cache: KVCache
    sampler: Sampler
    prompt_ids: list[int]
    stops: StopRules
    processors: tuple[LogitProcessor, ...] = ()
    keep_logits: bool = False
    kept: list[np.ndarray] = field(default_factory=list)  # (V,) rows: every prompt position, then each step's
    logprobs: int | None = None  # None: no logprobs; k: each answer token's and its k alternatives'
    token_logprobs: list[TokenLogprob] = field(default_factory=list)
    next_token: int = -1  # the token the next decode step runs

    @property
    def ids(self) -> list[int]:
        return self.stops.ids

    @property
    def reason(self) -> str | None:
        return self.stops.reason

    @property
    def done(self) -> bool:
        return self.stops.reason is not None

    @property
    def prefilled(self) -> bool:
        return self.cache.length >= len(self.prompt_ids)


def new_sequence(model: Decoder, prompt_ids: list[int], sampler: Sampler, stops: StopRules, capacity: int,
                 processors: tuple[LogitProcessor, ...] = (), keep_logits: bool = False,
                 logprobs: int | None = None) -> Sequence:
    """A sequence with a fresh KV cache of `capacity` positions (prompt and answer)."""
    return Sequence(model, model.new_cache(capacity), sampler, list(prompt_ids), stops, tuple(processors),
                    keep_logits, logprobs=logprobs)


def prefill_next(seq: Sequence, chunk: int) -> np.ndarray | None:
    """Run the next `chunk` positions of the prompt; once the prompt is all in the cache,
    return its last position's logits (V,), else None."""
    start = seq.cache.length
    ids = np.asarray(seq.prompt_ids[start:start + chunk])
    logits = seq.model.forward(ids, seq.cache, "all" if seq.keep_logits else "last")
    if seq.keep_logits:
        seq.kept.extend(logits)
    return logits[-1] if seq.prefilled else None


def first_token(seq: Sequence, logits: np.ndarray) -> str | None:
    """Sample the first answer token from the prompt's last logits (V,); returns the stop
    reason if generation ends with it (or before it: max_tokens 0)."""
    check_finite(logits)
    if seq.stops.max_tokens <= 0:
        return seq.stops.finish(LENGTH)
    return _take(seq, logits)


def decode(seqs: list[Sequence], kernels) -> list[NumericsError | None]:
    """One decode step for every sequence (one base; slm.model.batch.decode_step), then each
    samples its next token and applies its stop rules. Returns, per sequence, None or the
    NumericsError of a row whose logits were not finite or all equal (that sequence took no token)."""
    logits = decode_step([Row(s.model, s.cache, s.next_token) for s in seqs], kernels)  # (B, V)
    sound = _sound(logits.max(axis=-1), logits.min(axis=-1))  # (for the batch; rows only when it fails)
    errors: list[NumericsError | None] = []
    for seq, row in zip(seqs, logits):
        try:
            if not sound:
                check_finite(row)
        except NumericsError as err:
            errors.append(err)
            continue
        if seq.keep_logits:
            seq.kept.append(row)
        _take(seq, row)
        errors.append(None)
    return errors


def _take(seq: Sequence, logits: np.ndarray) -> str | None:
    raw = logits
    for process in seq.processors:
        logits = process(seq.ids, logits)
    token = seq.sampler(logits)
    seq.next_token = token
    if seq.logprobs is not None and not seq.stops.hidden(token):
        seq.token_logprobs.append(token_logprob(raw, token, seq.logprobs))  # (before on_text hears of it)
    # an end that leaves a grammar's answer incomplete is a cut (slm.engine.grammar's mask: `cut`,
    # and `accepts` for what a stop sequence leaves)
    cut = token in seq.stops.eos_ids and any(getattr(process, "cut", False) for process in seq.processors)
    grammar = next((process for process in seq.processors if hasattr(process, "accepts")), None)
    return seq.stops.take(token, cache_full=seq.cache.length >= seq.cache.capacity, cut=cut,
                          accepts=None if grammar is None else grammar.accepts)


def check_finite(row: np.ndarray) -> None:
    """Sampling from NaN or inf logits picks token 0 silently; refuse instead (exit 10). So for
    a row whose logits are all the same value: no model's are, but an overflow inside the network
    gives them (activations beyond float32's range: the norm's sum of squares is inf, its scale 0,
    and every logit exactly 0.0), and sampling would take the first end-of-generation token or
    token 0 as if it were an answer. Weights are checked finite at import and bounded at
    activation, so this catches overflow in the arithmetic. Two reductions over the row (its
    max and min: a NaN or an inf shows in one of them) and no copy of it: it runs every token."""
    if not _sound(row.max(), row.min()):
        raise NumericsError("the model produced non-finite logits or logits all equal: an overflow in this "
                            "composition's arithmetic (an adapter's weight or values too large for float32)")


def _sound(highest, lowest) -> bool:
    """Whether rows of logits with these maxima and minima are finite and not all equal."""
    return bool(np.isfinite(highest).all() and np.isfinite(lowest).all() and (highest > lowest).all())
