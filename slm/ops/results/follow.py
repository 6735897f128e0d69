"""The results of `slm follow`: one round, and the follower's status (what every result
shares: slm.ops.results)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slm.ops.results import Result
from slm.ops.results.health import HealthReport  # inside FollowRound


@dataclass(frozen=True)
class FollowRound(Result):
    """One round: `outcome` is updated (a new version passed its checks and is marked good),
    current (the tag names what runs), rolled-back (the trial failed: the last good one runs
    again, the trial is marked bad) or known-bad (the tag names a composition marked bad)."""

    reference: str
    outcome: str
    composition: str | None  # what is active when the round ends
    version: int | None  # the good version of the tag (None: none marked good yet)
    manifest: str | None  # the good version's manifest digest
    message: str
    health: HealthReport | None = None  # the trial's checks, when a trial ran

    @property
    def ok(self) -> bool:
        """Whether the round updated the device or found it current (not a rolled-back trial,
        not a tag naming a composition marked bad)."""
        return self.outcome in ("updated", "current")

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "health": None if self.health is None else self.health.to_json()}

    def check(self) -> None:
        """Raise Unhealthy (exit 18) for a rolled-back trial or a tag that names a bad composition."""
        from slm.errors import Unhealthy

        if not self.ok:
            raise Unhealthy(self.message)


@dataclass(frozen=True)
class FollowStatus(Result):
    """`slm follow --status`: the state in the store (good, trial, bad) and the last round's
    report (advisory: last check, outcome, error, next try)."""

    reference: str | None
    following: bool  # a follower holds the store's follow lock now
    active: str | None
    good: dict[str, Any] | None
    trial: dict[str, Any] | None
    bad: list[dict[str, Any]]
    last_check: str | None
    last_outcome: str | None
    last_error: str | None
    last_exit_code: int | None
    next_try: str | None
    failures: int
