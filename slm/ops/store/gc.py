"""`slm gc [--dry-run] [--prune-now]`: remove what nothing can reach; print the plan first.

Retention (git's): kept are what every name points at (bases, adapters, tags, pulled
references), what every entry of a name's reflog newer than config.toml's gc.reflog_expiry
(default 90 days; --prune-now: none) pointed at, the active composition and every composition
in its reflog (so `slm rollback --to` and `@active~N` can reach any of them), with every blob
those manifests name. Removed: other blobs (an old version of a moved name once its log entry
expired, what an interrupted import left), composition records nothing keeps, and prefix-cache
entries of compositions that are no longer kept. Name reflogs are not rewritten: an expired
entry stays as history, its object gone. lost+found/ is left for the operator.
"""

from __future__ import annotations

import time
from dataclasses import replace

from slm.compose.adapter_manifest import parse_adapter_manifest
from slm.compose.base_manifest import parse_base_manifest
from slm.formats.gguf_frame import parse_frame_record
from slm.errors import IntegrityError, NeedsRecovery, NotFound
from slm.ops.infer import compositions
from slm.ops.results import GcPlan
from slm.store import StoreDir
from slm.store import digest as dg
from slm.store import fs
from slm.store.config import reflog_expiry_s
from slm.store.journal import Intent, intent_name
from slm.store.names import NAMED_KINDS, SIDE_KINDS
from slm.store.transaction import Recovery, Seen

KIND = "gc"  # journal/gc.intent


def _named_targets(store: StoreDir, expiry_s: float) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(what each kind's names point at now, what their unexpired reflog entries pointed at)."""
    now = {kind: {d for _, d in store.names.items(kind)} for kind in NAMED_KINDS}
    past: dict[str, set[str]] = {kind: set() for kind in NAMED_KINDS}
    cutoff = time.time() - expiry_s
    for kind in NAMED_KINDS:
        for _, log in store.names.logged(kind):
            state = log.read()
            if state.torn_tail:
                raise NeedsRecovery(f"{log.path} ends with a torn line; run `slm fsck --repair` before gc")
            past[kind].update(d for e in state.entries if e.time > cutoff for d in (e.old, e.new) if d)
    return now, past


def _reachable(store: StoreDir, expiry_s: float) -> tuple[set[str], set[str]]:
    """(blobs to keep, composition ids to keep)."""
    keep: set[str] = set()
    now, past = _named_targets(store, expiry_s)

    def base(digest: str) -> None:
        keep.add(digest)
        keep.update(parse_base_manifest(store.objects.read_verified(digest)).blob_digests())
        for kind in SIDE_KINDS:  # its origin, the frame of the GGUF file it came from
            record = store.names.get(kind, dg.hex_of(digest))
            if record is not None and store.objects.has(record):
                keep.add(record)
                if kind == "gguf":
                    keep.add(parse_frame_record(store.objects.read_verified(record), "gguf frame record")[0])

    def adapter(digest: str) -> None:
        keep.add(digest)
        keep.update(parse_adapter_manifest(store.objects.read_verified(digest)).blob_digests())

    for digest in now["bases"]:
        base(digest)
    for digest in now["adapters"]:
        adapter(digest)
    # an old target of a name may be gone already (collected once its entry had expired, or by
    # --prune-now): the entry keeps only what is still there
    for digest in past["bases"] - now["bases"]:
        if store.objects.has(digest):
            base(digest)
    for digest in past["adapters"] - now["adapters"]:
        if store.objects.has(digest):
            adapter(digest)
    entries = store.reflog.entries()
    comps = {e.new for e in entries} | {e.old for e in entries if e.old} | now["tags"] | now["remotes"]
    comps |= {c for c in past["tags"] | past["remotes"]
              if store.names.get("compositions", dg.hex_of(c)) is not None}
    active = store.active_ref.read()
    if active:
        comps.add(active)
    for comp_id in comps:
        keep.add(store.names.resolve("compositions", dg.hex_of(comp_id)))
        comp = compositions.load(store, comp_id)
        keep.update(comp.signatures)
        keep.update(comp.certificates)
        base(comp.base)
        for a in comp.adapters:
            adapter(a.digest)
    return keep, comps


def plan(store: StoreDir, prune_now: bool = False) -> GcPlan:
    if store.journal.pending() or store.reflog.read().torn_tail:
        raise NeedsRecovery("an earlier transaction was interrupted; run `slm fsck --repair` before gc")
    expiry_s = 0.0 if prune_now else reflog_expiry_s(store.config)
    try:
        keep, comps = _reachable(store, expiry_s)
    except NotFound as err:  # a reflog line, a name or a record naming what the store lacks
        raise IntegrityError(f"the store is damaged: {err}; gc cannot tell what is reachable "
                             "(run `slm fsck`)") from None
    blobs = sorted(d for d in store.objects.digests() if d not in keep)
    records = sorted(h for h, _ in store.names.items("compositions") if dg.PREFIX + h not in comps)
    prefix_root = store.path("cache", "prefix")
    caches = sorted(p.name for p in prefix_root.iterdir() if dg.PREFIX + p.name not in comps) \
        if prefix_root.is_dir() else []
    sizes = {d: store.objects.size(d) for d in blobs}
    return GcPlan(tuple({"digest": d, "bytes": sizes[d]} for d in blobs), tuple(records), tuple(caches),
                  sum(sizes.values()), len(keep), reflog_expiry_s=expiry_s)


def gc(store: StoreDir, dry_run: bool = False, on_plan=None, prune_now: bool = False) -> GcPlan:
    """Remove what nothing reaches (on_plan(plan) is called with the plan first)."""
    with store.locked():
        p = plan(store, prune_now)
        if on_plan:
            on_plan(p)
        if dry_run:
            return p
        # each removal is final on its own (all of it unreachable): nothing to undo, no commit
        # point; an interrupted gc is cleared by `slm fsck --repair` and finished by the next one
        with store.transaction(intent_name(KIND), "gc", dg.of_bytes(repr(p).encode()), undoable=False):
            for hex_id in p.composition_records:
                store.names.remove("compositions", hex_id)
            removed = {entry["digest"] for entry in p.blobs}
            for kind in SIDE_KINDS:  # the records beside a base gc removes
                for hex_id, record in store.names.items(kind):
                    if dg.PREFIX + hex_id in removed or record in removed:
                        store.names.remove(kind, hex_id)
            for entry in p.blobs:
                fs.point("gc.before-unlink")
                fs.unlink(store.objects.path(entry["digest"]))
            if p.blobs:
                fs.fsync_dir(store.objects.dir)
            for name in p.cache_dirs:
                fs.remove_tree(store.path("cache", "prefix", name))
    return replace(p, dry_run=False)


def recover(store: StoreDir, intent: Intent, seen: Seen) -> Recovery:
    """An interrupted gc removed only what nothing reaches, each removal final on its own:
    there is nothing to finish or undo but the intent; the next gc removes the rest."""
    return Recovery("an interrupted gc (it removed only unreachable data)", "clear it; run `slm gc` again to finish")
