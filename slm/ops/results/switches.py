"""The results of compositions and switches: activate, deactivate, rollback, upgrade,
status, log (what every result shares: slm.ops.results)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slm.ops.results import Result


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
    def of(cls, comp: Any) -> CompositionInfo:
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


@dataclass(frozen=True)
class Status(Result):
    active: CompositionInfo | None
    transitions: int
    torn_reflog_tail: bool
    interrupted_transaction: bool
    names: tuple[str, ...] = ()  # the tags and pulled references (NAME, NAME@{N}) naming the active one
    spec: str | None = None  # a spec naming its parts as the store's names spell them now


@dataclass(frozen=True)
class LogEntry(Result):
    seq: int
    op: str
    old: str | None
    new: str | None  # None: a name's removal (`slm log NAME`)
    time: float
    names: tuple[str, ...] = ()  # every NAME and NAME@{N} that names `new` now
    old_names: tuple[str, ...] = ()  # ... and `old`


@dataclass(frozen=True)
class NameMove(Result):
    """A name moved (`slm tag`, `rm`, `mv`, an import under a taken name, a pull): from
    `old` to `new` (None: absent); `moved` False when it already pointed there."""

    kind: str
    name: str
    old: str | None
    new: str | None
    moved: bool
    op: str
