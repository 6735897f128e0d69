"""The results of the integrity checks: fsck, gc, verify (what every result shares:
slm.ops.results)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slm.ops.results import Result
from slm.ops.results.switches import AdapterEntry


@dataclass(frozen=True)
class Finding(Result):
    problem: str  # a short kind: corrupt-blob, torn-reflog, interrupted, ...
    what: str  # which file or object, and what is wrong
    action: str = ""  # what --repair did (or would do)
    repaired: bool = False
    repairable: bool = True


@dataclass(frozen=True)
class FsckReport(Result):
    clean: bool
    repair: bool
    blobs_checked: int
    bytes_checked: int
    findings: tuple[Finding, ...]
    unresolved: int

    @property
    def exit_code(self) -> int:
        """0 clean (or all repaired), 9 an interrupted transaction --repair finishes, 5 damage."""
        unresolved = [f for f in self.findings if not f.repaired]
        if not unresolved:
            return 0
        if any(f.problem in ("torn-reflog", "interrupted", "ref-mismatch", "junk") and f.repairable
               for f in unresolved):
            return 9
        return 5

    def check(self) -> None:
        """Raise the error an unclean fsck exits with: NeedsRecovery (9) if `--repair` finishes
        what is left, else IntegrityError (5)."""
        from slm.errors import IntegrityError, NeedsRecovery

        code = self.exit_code
        if code == 0:
            return
        left = [f for f in self.findings if not f.repaired]
        what = f"{len(left)} problem(s) {'left after --repair' if self.repair else 'found'}"
        if code == 9:
            raise NeedsRecovery(f"fsck: {what}, e.g. {left[0].problem}: run `slm fsck --repair`")
        raise IntegrityError(f"fsck: {what}, e.g. {left[0].problem}: {left[0].what}")


@dataclass(frozen=True)
class GcPlan(Result):
    blobs: tuple[dict, ...]  # {"digest", "bytes"}
    composition_records: tuple[str, ...]
    cache_dirs: tuple[str, ...]
    bytes: int
    kept_blobs: int
    dry_run: bool = True
    reflog_expiry_s: float | None = None  # name-reflog entries older than this were not kept
    pull_stagings: tuple[str, ...] = ()  # tmp/pull-<manifest hex>: interrupted pulls' staging, abandoned
    active_log_expired: int = 0  # the oldest entries of logs/active its retention drops
    active_log_keep: int | None = None  # the retention applied: the newest entries always kept,
    active_log_expiry_s: float | None = None  # and the age past which older ones go


@dataclass(frozen=True)
class VerifyReport(Result):
    """`slm verify`: every blob re-hashed, and (unless skipped) logits vs the float64 oracle."""

    composition: str
    base: str
    adapters: tuple[AdapterEntry, ...]
    integrity: dict[str, Any]  # blobs, bytes, bad_blobs, cache_entries, bad_cache_entries, ok
    numerics: dict[str, Any] | None  # probes, positions, errors, tolerance, ok; None if skipped

    @property
    def ok(self) -> bool:
        return bool(self.integrity["ok"]) and (self.numerics is None or bool(self.numerics["ok"]))

    def check(self) -> None:
        """Raise the error a failed verify exits with: integrity (5) before numerics (10)."""
        from slm.errors import IntegrityError, NumericsError

        if not self.integrity["ok"]:
            bad = self.integrity["bad_blobs"]
            if not bad:
                bad = self.integrity["bad_cache_entries"]
                raise IntegrityError(f"verify failed: {len(bad)} prompt-cache entr{'y' if len(bad) == 1 else 'ies'} "
                                     f"of this composition do not match their digest, e.g. {bad[0]} "
                                     "(`slm fsck --repair` removes them)")
            raise IntegrityError(f"verify failed: {len(bad)} blob(s) missing or corrupt, e.g. {bad[0]}")
        n = self.numerics
        if n is not None and not n["ok"]:
            raise NumericsError(
                f"verify failed: logits differ from the fresh-base oracle (max abs {n['max_abs_error']:.2e}, "
                f"mean {n['mean_abs_error']:.2e}, top-1 agreement {n['top1_agreement']:.3f})")
