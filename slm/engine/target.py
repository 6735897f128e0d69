"""What a request runs on: a Target, the engine's one view of a staged composition (its id,
tokenizer, network and memory estimate). slm.ops.infer.loading.Loaded is one; the engine never
asks where it came from (the store, the compose layer), so it imports nothing above slm.model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # (a protocol: nothing of the network is needed to state it)
    from slm.model.decoder import Decoder
    from slm.model.tokenizer import TextTokenizer


class MemoryEstimate(Protocol):
    """What preparation needs of a memory estimate (slm.compose.memory.Estimate is one)."""

    @property
    def total(self) -> int: ...

    def describe(self) -> str: ...

    def to_json(self) -> dict: ...


@runtime_checkable
class Target(Protocol):
    """A composition ready to run: the prompt cache keys its entries by `id`."""

    @property
    def id(self) -> str: ...

    tokenizer: TextTokenizer
    model: Decoder

    def memory_estimate(self, positions: int, prompt_tokens: int, sequences: int = 1, all_logits: bool = False,
                        mode: str | None = None) -> MemoryEstimate:
        """The memory a generation of `positions` (prompt and answer) would take, for
        `sequences` of them at once, in numerics mode `mode` (slm.model.modes)."""
