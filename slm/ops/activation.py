"""activate / deactivate / rollback: one transaction each, in the order of docs/concepts.md.

    validate + stage (nothing written) -> composition manifest durable -> journal intent ->
    reflog line (checksummed, fsynced) -> refs/active replaced -> journal cleared

Any failure before the reflog line leaves refs/active, the reflog and the names as they were.
A command that finds an interrupted transaction (a journal intent) refuses and points to
`slm fsck --repair`.
"""

from __future__ import annotations

from slm.compose.composition import Composition, stamped
from slm.errors import InvalidInput, NeedsRecovery, NotFound
from slm.ops import budget, compositions
from slm.store import Store
from slm.store import digest as dg
from slm.store.reflog import Entry


def _check_recovered(store: Store) -> None:
    if store.journal.pending():
        raise NeedsRecovery("an earlier transaction was interrupted; run `slm fsck --repair`")


def _describe(comp: Composition, comp_id: str) -> dict:
    return {
        "id": comp_id,
        "base": comp.base,
        "base_name": comp.base_name,
        "adapters": [{"name": a.name, "digest": a.digest, "weight": a.weight} for a in comp.adapters],
    }


def switch(store: Store, comp: Composition, op: str, memory_budget: str | None = None) -> dict:
    """Make `comp` the active composition (the one transaction behind every verb)."""
    with store.locked():
        _check_recovered(store)
        old = store.active_ref.read()
        staged = compositions.stage(store, comp)  # every check, every re-hash; nothing written
        est = budget.of_staged(staged)
        budget.check(est, budget.resolve(store, memory_budget), "this composition")
        new = comp.id
        if new == old:
            return {"changed": False, "previous": old, "active": _describe(comp, new),
                    "memory_estimate": est.to_json()}
        _store_manifest(store, stamped(comp, f"slm {op}"))
        intent = store.journal.begin("active", op, old, new)
        store.reflog.append(old, new, op)
        store.active_ref.write(new)
        store.journal.end(intent)
    return {"changed": True, "previous": old, "active": _describe(comp, new),
            "memory_estimate": est.to_json()}


def _store_manifest(store: Store, comp: Composition) -> None:
    key = dg.hex_of(comp.id)
    if store.names.get("compositions", key) is not None:
        return  # first creation's provenance is kept
    staging = store.objects.staging()
    try:
        digest = staging.put(comp.to_toml())
        staging.commit()
    finally:
        staging.discard()
    store.names.set("compositions", key, digest)


def activate(store: Store, base: str | None, adapters: list[str], manifest_file=None,
             memory_budget: str | None = None) -> dict:
    if manifest_file is not None:
        if base is not None or adapters:
            raise InvalidInput("give either -f FILE or BASE [ADAPTER...], not both")
        comp = compositions.from_file(manifest_file)
    elif base is None:
        raise InvalidInput("name a base (and adapters), or a composition file with -f")
    else:
        comp = compositions.build(store, base, adapters)
    return switch(store, comp, "activate", memory_budget)


def active(store: Store) -> Composition | None:
    comp_id = store.active_ref.read()
    return None if comp_id is None else compositions.load(store, comp_id)


def deactivate(store: Store, adapter_name: str) -> dict:
    with store.locked():  # read and switch under one lock (the lock is re-entrant)
        current = active(store)
        if current is None:
            raise NotFound("nothing is active")
        kept = [a for a in current.adapters if a.name != adapter_name]
        if len(kept) == len(current.adapters):
            return {"changed": False, "previous": current.id, "active": _describe(current, current.id),
                    "note": f"adapter {adapter_name!r} is not active"}
        return switch(store, current.with_adapters(kept), "deactivate")


def rollback(store: Store, steps: int | None = None, to: str | None = None) -> dict:
    with store.locked():
        if to is not None:
            target = compositions.find_id(store, to)
        else:
            entries = store.reflog.entries()
            n = 1 if steps is None else steps
            if n < 1:
                raise InvalidInput("-n must be at least 1")
            if n > len(entries):
                raise InvalidInput(f"cannot roll back {n} steps: the log has {len(entries)} transitions")
            target = entries[-n].old
            if target is None:
                raise InvalidInput(f"{n} steps back nothing was active; nothing to roll back to")
        return switch(store, compositions.load(store, target), "rollback")


def status(store: Store) -> dict:
    comp_id = store.active_ref.read()
    entries = store.reflog.read()
    info = {"active": None, "transitions": len(entries.entries),
            "torn_reflog_tail": bool(entries.torn_tail),
            "interrupted_transaction": bool(store.journal.pending())}
    if comp_id is not None:
        info["active"] = _describe(compositions.load(store, comp_id), comp_id)
    return info


def log(store: Store) -> list[dict]:
    return [_entry(e) for e in reversed(store.reflog.entries())]


def _entry(e: Entry) -> dict:
    return {"seq": e.seq, "op": e.op, "old": e.old, "new": e.new, "time": e.time}
