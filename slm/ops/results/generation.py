"""The results of generation: `slm run`, a Session's generate, the server's requests
(what every result shares: slm.ops.results)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slm.engine.request import ToolCall
from slm.ops.results import Result
from slm.ops.results.switches import AdapterEntry


@dataclass(frozen=True)
class Timings(Result):
    prefill_s: float
    decode_s: float
    prefill_tok_s: float
    decode_tok_s: float


@dataclass(frozen=True)
class Alternative(Result):
    token: int
    text: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprobs(Result):
    """One answer token's logprob (log-softmax of the model's logits at its position, before
    penalties, bias, temperature and filters) and the most likely alternatives there."""

    token: int
    text: str  # the token's text alone (a part of a character shows as U+FFFD)
    logprob: float
    top: tuple[Alternative, ...]


@dataclass(frozen=True)
class Generation(Result):
    """One generation: the text, the token ids, and the composition it ran on."""

    composition: str  # the composition id
    base: str
    adapters: tuple[AdapterEntry, ...]
    prefix_cache: str  # "hit", "miss", or "damaged" (a miss: the entry failed its digest, slm.ops.infer.prefix_cache)
    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    text: str
    stop_reason: str  # "eos", "stop", "length", "switched", "cancelled" (slm.engine.stops)
    timings: Timings
    mode: str  # what the numbers were computed in: "int8" or "exact" (slm.model.modes)
    logits_out: str | None = None
    memory_estimate: dict[str, Any] | None = None
    seed: int | None = None  # the sampler's seed: the one given, else the fresh random one drawn
    logprobs: tuple[TokenLogprobs, ...] | None = None  # each answer token's, when asked
    tool_calls: tuple[ToolCall, ...] = ()  # with tools: the calls read from the answer (`text` is the rest)

    @property
    def composition_id(self) -> str:
        return self.composition

    def check(self) -> None:
        """`slm run` on the active composition stops at a switch unless told to finish: exit 11."""
        if self.stop_reason == "switched":
            from slm.errors import Switched

            raise Switched("the active composition changed during generation; stopped at a token "
                           "boundary (use --on-switch finish to complete on the pinned composition)")
