"""How long logs/active remembers: the retention `slm gc` applies to the active reflog (git's
reflog expiry; OSTree's bounded deployments).

    gc.active_log_keep = 100       the newest entries, always kept (--keep-active N)
    gc.active_log_expiry = "90d"   older entries go once they are older than this
                                   (--expire-active AGE|now)

What goes is the oldest run of entries that are both outside the `keep` newest and expired, so
the log stays one chain of transitions (each line's old id the line before's new id). The last
entry is never dropped (it names the active composition, which refs/active must agree with),
and every composition a kept entry names stays, `old` included: `slm rollback -n N` and
`@active~N` reach exactly the kept entries' compositions. What a name points at is kept by gc
whatever the log says (slm.ops.store.gc).

The rewrite (`expire`) is one step, final on its own: the kept lines, renumbered from 1, are
written to a new file that replaces logs/active atomically (temp, fsync, rename, fsync of
logs/): a crash leaves the old log or the new one, never a mix. gc makes it durable before it
removes anything only the dropped entries reached, so no log line ever names what is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slm.errors import InvalidInput
from slm.store import StoreDir, fs
from slm.store.config import active_log_expiry_s, active_log_keep, duration_s
from slm.store.reflog import Entry


@dataclass(frozen=True)
class Retention:
    keep: int  # entries always kept (the last one is kept even at 0)
    expiry_s: float  # older entries past the keep window go once this old


def policy(store: StoreDir, keep: int | None = None, expire: str | None = None) -> Retention:
    """config.toml's [gc] policy, each part overridden by this run's value when given."""
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
        raise InvalidInput(f"--keep-active must be a whole number of entries, 0 or more, not {keep!r}")
    return Retention(active_log_keep(store.config) if keep is None else keep,
                     active_log_expiry_s(store.config) if expire is None else duration_s(expire, "--expire-active"))


def expired(entries: list[Entry], rule: Retention, now: float) -> int:
    """How many of the oldest entries the rule drops (never the last one)."""
    limit = max(0, len(entries) - max(rule.keep, 1))
    cutoff = now - rule.expiry_s
    dropped = 0
    while dropped < limit and entries[dropped].time <= cutoff:
        dropped += 1
    return dropped


def expire(store: StoreDir, dropped: int) -> None:
    """Replace logs/active by its lines after the `dropped` oldest, renumbered (one atomic,
    durable replace; under the store lock, inside gc's transaction)."""
    kept = store.reflog.entries()[dropped:]
    fs.point("gc.before-reflog-rewrite")
    store.reflog.rewrite([replace(e, seq=seq) for seq, e in enumerate(kept, 1)])
