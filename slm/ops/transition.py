"""What a switch (activate, deactivate, rollback) returns, and the base of every typed result
(slm.ops.results, slm.ops.reports): frozen dataclasses, so a result cannot be changed after
the fact by whoever holds it, each with `to_json()` (plain dicts and lists, what `--json`
prints). Alone in this module because `slm activate` loads nothing else of them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


class Result:
    def to_json(self) -> dict:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class AdapterEntry(Result):
    name: str
    digest: str
    weight: float


@dataclass(frozen=True)
class CompositionInfo(Result):
    """A composition as the user sees it: its id, its base and its adapters in load order."""

    id: str
    base: str
    base_name: str
    adapters: tuple[AdapterEntry, ...]

    @classmethod
    def of(cls, comp) -> "CompositionInfo":
        """From a slm.compose.composition.Composition (the one place this view is built)."""
        return cls(comp.id, comp.base, comp.base_name,
                   tuple(AdapterEntry(a.name, a.digest, a.weight) for a in comp.adapters))


@dataclass(frozen=True)
class Transition(Result):
    """What activate / deactivate / rollback did."""

    changed: bool
    previous: str | None
    active: CompositionInfo
    memory_estimate: dict[str, Any] | None = None
    note: str = ""
