"""Typed results of the operations: what the public API returns and the CLI prints.

Frozen dataclasses, so a result cannot be changed after the fact by whoever holds it; each
has `to_json()` (plain dicts and lists, what `--json` prints). Built in one place each: the
operation that produced the facts.

What a switch returns is in slm.ops.transition, the reports of fsck, gc and verify in
slm.ops.reports: `slm activate`, a new process each time, loads the first alone (creating a
frozen dataclass is ~1 ms of start-up). Their names are found here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slm.ops.transition import AdapterEntry, CompositionInfo, Result, Transition  # noqa: F401


@dataclass(frozen=True)
class Status(Result):
    active: CompositionInfo | None
    transitions: int
    torn_reflog_tail: bool
    interrupted_transaction: bool


@dataclass(frozen=True)
class LogEntry(Result):
    seq: int
    op: str
    old: str | None
    new: str
    time: float


@dataclass(frozen=True)
class Timings(Result):
    prefill_s: float
    decode_s: float
    prefill_tok_s: float
    decode_tok_s: float


@dataclass(frozen=True)
class Generation(Result):
    """One generation: the text, the token ids, and the composition it ran on."""

    composition: str  # the composition id
    base: str
    adapters: tuple[AdapterEntry, ...]
    prefix_cache: str  # "hit" or "miss"
    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    text: str
    stop_reason: str  # "eos", "length", "context", "switched"
    timings: Timings
    logits_out: str | None = None
    memory_estimate: dict[str, Any] | None = None

    @property
    def composition_id(self) -> str:
        return self.composition

    def check(self) -> None:
        """`slm run` on the active composition stops at a switch unless told to finish: exit 11."""
        if self.stop_reason == "switched":
            from slm.errors import Switched

            raise Switched("the active composition changed during generation; stopped at a token "
                           "boundary (use --on-switch finish to complete on the pinned composition)")


_REPORTS = ("Finding", "FsckReport", "GcPlan", "VerifyReport")


def __getattr__(name: str):
    if name in _REPORTS:
        from slm.ops import reports

        return getattr(reports, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
