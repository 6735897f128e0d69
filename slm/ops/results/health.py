"""The result of `slm health`: the checks of a composition, in the order they ran (what every
result shares: slm.ops.results)."""

from __future__ import annotations

from dataclasses import dataclass

from slm.ops.results import Result

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True)
class HealthCheck(Result):
    """One check: its name ("integrity", "certificate", "generation", "script:NAME"), its status
    (passed, failed, skipped: did not apply, or a health.d entry not run), a one-line reason and
    how long it took."""

    name: str
    status: str
    reason: str
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.status == PASSED


@dataclass(frozen=True)
class HealthReport(Result):
    """The checks run on a composition, stopped at the first failure (the checks after it are
    not in the report)."""

    composition: str
    checks: tuple[HealthCheck, ...]

    @property
    def healthy(self) -> bool:
        return all(c.status != FAILED for c in self.checks)

    @property
    def failed(self) -> HealthCheck | None:
        return next((c for c in self.checks if c.status == FAILED), None)

    def to_json(self) -> dict:
        return {**super().to_json(), "healthy": self.healthy}

    def check(self) -> None:
        """Raise Unhealthy (exit 18) naming the failed check and its reason."""
        from slm.errors import Unhealthy

        bad = self.failed
        if bad is not None:
            raise Unhealthy(f"unhealthy: the {bad.name} check failed: {bad.reason}")
