"""`slm gc [--dry-run]`: remove what nothing can reach; print the plan first.

Retention: kept are every named base and adapter, the active composition, and every
composition that appears in the reflog (so `slm rollback --to` can reach any of them), with
every blob those manifests name. Removed: other blobs (e.g. left by an interrupted import),
composition records that no ref or reflog line names, and prefix-cache entries of compositions
that are no longer kept. lost+found/ is left for the operator.
"""

from __future__ import annotations

from slm.compose.adapter_manifest import parse_adapter_manifest
from slm.compose.base_manifest import parse_base_manifest
from slm.formats.gguf_frame import parse_frame_record
from dataclasses import replace

from slm.errors import NeedsRecovery
from slm.ops import compositions
from slm.ops.results import GcPlan
from slm.store import StoreDir
from slm.store import digest as dg
from slm.store.names import SIDE_KINDS
from slm.store import fs


def _reachable(store: StoreDir) -> tuple[set[str], set[str]]:
    """(blobs to keep, composition ids to keep)."""
    keep: set[str] = set()

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

    for _, digest in store.names.items("bases"):
        base(digest)
    for _, digest in store.names.items("adapters"):
        adapter(digest)
    comps = {e.new for e in store.reflog.entries()} | {e.old for e in store.reflog.entries() if e.old}
    active = store.active_ref.read()
    if active:
        comps.add(active)
    for comp_id in comps:
        keep.add(store.names.resolve("compositions", dg.hex_of(comp_id)))
        comp = compositions.load(store, comp_id)
        keep.update(comp.signatures)
        base(comp.base)
        for a in comp.adapters:
            adapter(a.digest)
    return keep, comps


def plan(store: StoreDir) -> GcPlan:
    if store.journal.pending() or store.reflog.read().torn_tail:
        raise NeedsRecovery("an earlier transaction was interrupted; run `slm fsck --repair` before gc")
    keep, comps = _reachable(store)
    blobs = sorted(d for d in store.objects.digests() if d not in keep)
    records = sorted(h for h, _ in store.names.items("compositions") if dg.PREFIX + h not in comps)
    prefix_root = store.path("cache", "prefix")
    caches = sorted(p.name for p in prefix_root.iterdir() if dg.PREFIX + p.name not in comps) \
        if prefix_root.is_dir() else []
    sizes = {d: store.objects.size(d) for d in blobs}
    return GcPlan(tuple({"digest": d, "bytes": sizes[d]} for d in blobs), tuple(records), tuple(caches),
                  sum(sizes.values()), len(keep))


def gc(store: StoreDir, dry_run: bool = False, on_plan=None) -> GcPlan:
    """Remove what nothing reaches (on_plan(plan) is called with the plan first)."""
    with store.locked():
        p = plan(store)
        if on_plan:
            on_plan(p)
        if dry_run:
            return p
        # each removal is final on its own (all of it unreachable): nothing to undo, no commit
        # point; an interrupted gc is cleared by `slm fsck --repair` and finished by the next one
        with store.transaction("gc", "gc", dg.of_bytes(repr(p).encode()), undoable=False):
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
