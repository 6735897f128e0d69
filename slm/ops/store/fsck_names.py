"""`slm fsck`'s checks of user names against each other and against their logs (called by
slm.ops.store.fsck once interrupted transactions are dealt with):

    a name file that disagrees with its log's last line -> the name follows its log (the log
                                                           is the commit record); a name with
                                                           no log gets one, from its file
    a name held by a tag and a base or an adapter        -> the tag is renamed to a free name
                                                           (naming.KEPT_APART: such a name
                                                           resolves differently per verb, and
                                                           rm/mv/log refuse it)

`add(problem, what, action, fix)` is the checker's (slm.ops.store.fsck.Fsck.add): it runs `fix`
when repairing.
"""

from __future__ import annotations

import itertools
from typing import Callable

from slm.errors import SlmError
from slm.ops.store import naming
from slm.store import StoreDir
from slm.store import digest as dg
from slm.store.names import NAMED_KINDS

Add = Callable[..., None]


def check_names(store: StoreDir, add: Add, repair: bool) -> None:
    # an interrupted move's name and log disagree until --repair has finished or undone it
    if repair or not store.journal.pending():
        for kind in NAMED_KINDS:
            for name in sorted(_current(store, kind) | {n for n, _ in store.names.logged(kind)}):
                _check_against_log(store, add, kind, name)
    _check_owned_twice(store, add)


def _current(store: StoreDir, kind: str) -> set[str]:
    return {name for name, digest, error in store.names.scan(kind) if error is None}


def _check_against_log(store: StoreDir, add: Add, kind: str, name: str) -> None:
    label = f"{naming.KIND_LABEL[kind]} {name!r}"
    try:
        entries = store.names.log(kind, name).read().entries  # damaged/torn: fsck's log checks
        target = store.names.get(kind, name)
    except SlmError:
        return
    logged = entries[-1].new if entries else None
    if target == logged:
        return
    if not entries:
        add("name-without-log", f"{label} has no log", f"start its log at {dg.short(target)}",
            lambda: naming.log_missing_line(store, kind, name, None, target, "repaired"))
        return
    shown = dg.short(target) if target else "absent"
    wanted = dg.short(logged) if logged else "removed"
    if logged is None or _stored(store, kind, logged):
        def follow_log():
            if logged is None:
                store.names.remove(kind, name)
            else:
                store.names.set(kind, name, logged)
        add("name-log-mismatch", f"{label} is {shown}, but its log's last line says {wanted}",
            "make the name follow its log" + ("" if logged else " (remove it)"), follow_log)
    else:  # e.g. a receive cut off before its commit point: its names' first lines, undone
        add("name-log-mismatch", f"{label} is {shown}, but its log's last line says {wanted}, which "
            "the store does not hold", f"log the name as it is ({shown})",
            lambda: naming.log_missing_line(store, kind, name, logged, target, "repaired"))


def _stored(store: StoreDir, kind: str, digest: str) -> bool:
    """Whether what a name of `kind` would point at is in the store (a tag's or a pulled
    reference's composition by its record, a base's or an adapter's manifest by its blob)."""
    try:
        if kind in ("tags", "remotes"):
            return store.names.get("compositions", dg.hex_of(digest)) is not None
        return store.objects.has(digest)
    except SlmError:  # a damaged record: fsck's record checks report it
        return False


def _check_owned_twice(store: StoreDir, add: Add) -> None:
    tags = _current(store, "tags")
    for kind in ("bases", "adapters"):
        for name in sorted(tags & _current(store, kind)):
            free = _free_tag_name(store, name)

            def rename(name=name, free=free):
                digest = store.names.get("tags", name)
                naming.move(store, "tags", free, digest, "mv")
                naming.move(store, "tags", name, None, "mv-away")
            add("name-owned-twice", f"{name!r} names {naming.a_label(kind)} and a tag",
                f"rename the tag to {free!r}", rename)
            tags.discard(name)


def _free_tag_name(store: StoreDir, name: str) -> str:
    """`NAME-tag`, or `NAME-tag2`.. if that is taken too (in any kind, history included)."""
    for n in itertools.count(1):
        candidate = f"{name[:120]}-tag{n if n > 1 else ''}"
        if not naming.kinds_of(store, candidate, with_history=True):
            return candidate
