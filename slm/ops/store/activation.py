"""activate / deactivate / rollback: one transaction each, in the order of docs/concepts.md.

    preflight (the store is consistent) -> validate + stage (nothing written) ->
    journal intent -> composition record durable -> reflog line (THE COMMIT POINT) ->
    refs/active replaced -> journal cleared

A failure before the reflog line is durable is undone before the command returns (the
reflog is cut back, a composition record this transaction created is removed, the intent
cleared): the store is as it was, and the command fails with the error's own exit code. A
failure after it is not a failure of the transition, which is committed and survives: the
command exits with INCOMPLETE (13) and `slm fsck --repair` finishes it (`recover`, below). A
command that finds the store inconsistent (an interrupted transaction, a torn reflog, a ref
that disagrees with the reflog) refuses before writing anything and points to `slm fsck --repair`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slm.compose.composition import Composition, stamped
from slm.errors import IntegrityError, InvalidInput, NeedsRecovery, NotFound, UsageError
from slm.ops.infer import budget, compositions
from slm.ops.ship import policy
from slm.ops.store import specs, versions
from slm.ops.store.suggest import did_you_mean
from slm.ops.results import CompositionInfo, Transition
from slm.store import StoreDir, fs
from slm.store import digest as dg
from slm.store.journal import Intent, intent_name
from slm.store.reflog import ReflogState
from slm.store.transaction import Recovery, Seen

if TYPE_CHECKING:
    from slm.ops.results import LogEntry, Status

KIND = "active"  # journal/active.intent: one switch at a time


def preflight(store: StoreDir) -> tuple[ReflogState, str | None]:
    """Refuse, before anything is written, a store that is not in a committed consistent state.

    Returns the reflog and the active id, which the transition builds on. Runs under the lock.
    """
    if store.journal.pending():
        raise NeedsRecovery("an earlier transaction was interrupted; run `slm fsck --repair`")
    log = store.reflog.read()  # a damaged line before the last one: IntegrityError (exit 5)
    if log.torn_tail:
        raise NeedsRecovery("the reflog ends with a torn line; run `slm fsck --repair`")
    active = store.active_ref.read()
    committed = log.entries[-1].new if log.entries else None
    if active != committed:
        raise NeedsRecovery("refs/active does not name the composition of the last reflog line; "
                            "run `slm fsck --repair`")
    if active is not None and store.names.get("compositions", dg.hex_of(active)) is None:
        raise IntegrityError(f"the active composition {dg.short(active)} has no record in the store "
                             "(run `slm fsck`)")
    return log, active


def switch(store: StoreDir, comp: Composition, op: str, memory_budget: str | None = None) -> Transition:
    """Make `comp` the active composition (the one transaction behind every verb)."""
    with store.locked():
        log, old = preflight(store)
        policy.enforce(store, comp)  # require_signed: refused before anything is staged or written
        staged = compositions.stage(store, comp, load_overlays=False)  # every check and re-hash; nothing written
        est = budget.of_staged(staged)
        budget.check(est, budget.resolve(store, memory_budget), "this composition")
        new = comp.id
        if new == old:
            return Transition(False, old, CompositionInfo.of(comp), est.to_json())
        _commit(store, stamped(comp, f"slm {op}"), op, old, log)
    return Transition(True, old, CompositionInfo.of(comp), est.to_json())


def _commit(store: StoreDir, comp: Composition, op: str, old: str | None, log: ReflogState) -> None:
    new = comp.id
    created = store.names.get("compositions", dg.hex_of(new)) is None
    with store.transaction(intent_name(KIND), op, new, old=old, created=created,
                           done=f"the transition to {dg.short(new)} is committed") as tx:
        new_blobs: list[str] = []
        tx.on_undo(lambda: store.objects.remove_new(new_blobs))
        if created:  # an existing record keeps its first creation's provenance
            tx.on_undo(lambda: store.names.remove("compositions", dg.hex_of(new)))
            _store_manifest(store, comp, new_blobs)
        # an append whose fsync failed may still sit in the page cache: cut back to the committed size
        tx.on_undo(lambda: _cut_reflog(store, log.intact_size))
        tx.commit(lambda: store.reflog.append(old, new, op, log))  # durable: the commit point
        store.active_ref.write(new)


def recover(store: StoreDir, intent: Intent, seen: Seen) -> Recovery:
    """An interrupted switch is committed if the reflog's last line is its transition: then
    finishing it is refs/active following the reflog, which fsck sets. Otherwise it is undone:
    the composition record it created is removed, unless a reflog line names that composition."""
    old, new = dg.short_pair(intent.old or "-", intent.new)
    last = seen.transitions[-1] if seen.transitions else None
    if last is not None and (last.old, last.new) == (intent.old, intent.new):
        return Recovery(f"interrupted {intent.op} from {old} to {new}, committed in the reflog",
                        "finish it (refs/active follows the reflog)")
    named = {c for e in seen.transitions for c in (e.old, e.new) if c}
    if not intent.created or intent.new in named:
        return Recovery(f"interrupted {intent.op} from {old} to {new}, not committed", "undo it")
    return Recovery(f"interrupted {intent.op} from {old} to {new}, not committed",
                    "undo it (remove the composition record it created)",
                    lambda: store.names.remove("compositions", dg.hex_of(intent.new)))


def _cut_reflog(store: StoreDir, size: int) -> None:
    if store.reflog.path.exists() and store.reflog.path.stat().st_size > size:
        fs.truncate(store.reflog.path, size)


def _store_manifest(store: StoreDir, comp: Composition, new_blobs: list[str]) -> None:
    """Store the composition record; the blobs new to the store are added to `new_blobs`
    as soon as they exist, so that an undo after a later failure can remove them."""
    staging = store.objects.staging()
    try:
        digest = staging.put(comp.to_toml())
        new_blobs.extend(staging.commit())
    finally:
        staging.discard()
    store.names.set("compositions", dg.hex_of(comp.id), digest)


def activate(store: StoreDir, base: str | None, adapters: list[str], manifest_file=None,
             memory_budget: str | None = None) -> Transition:
    if manifest_file is not None:
        if base is not None or adapters:
            raise InvalidInput("give either -f FILE or BASE [ADAPTER...], not both")
        comp = compositions.from_file(manifest_file)
    elif base is None:
        raise InvalidInput("name a base (and adapters), or a composition file with -f")
    else:  # BASE ADAPTER... composes; a spec alone is any form of slm.ops.store.specs
        comp = compositions.build(store, base, adapters) if adapters else specs.resolve(store, base)
    return switch(store, comp, "activate", memory_budget)


def stored_composition(store: StoreDir, ref: str) -> Composition | None:
    """`slm activate ID`: a stored composition by id or unique prefix (a pulled one, say), when
    no base has that name; None otherwise."""
    try:
        if store.names.get("bases", ref) is not None:
            return None
    except InvalidInput:
        pass  # not a valid name: maybe an id
    try:
        return compositions.load(store, compositions.find_id(store, ref))
    except NotFound:
        return None


def active(store: StoreDir) -> Composition | None:
    comp_id = store.active_ref.read()
    return None if comp_id is None else compositions.load(store, comp_id)


def deactivate(store: StoreDir, adapter_name: str) -> Transition:
    with store.locked():  # read and switch under one lock (the lock is re-entrant)
        _, current_id = preflight(store)
        if current_id is None:
            raise NotFound("nothing is active")
        current = compositions.load(store, current_id)
        kept = [a for a in current.adapters if a.name != adapter_name]
        if len(kept) == len(current.adapters):
            try:
                known = store.names.get("adapters", adapter_name) is not None
            except InvalidInput:
                known = False
            if not known:  # a typo must not report success
                names = [a.name for a in current.adapters] + [n for n, _ in store.names.items("adapters")]
                raise NotFound(f"no adapter named {adapter_name!r} in the active composition or the store"
                               + did_you_mean(adapter_name, names))
            return Transition(False, current.id, CompositionInfo.of(current),
                              note=f"adapter {adapter_name!r} is not active")
        return switch(store, current.with_adapters(kept), "deactivate")


def rollback(store: StoreDir, steps: int | None = None, to: str | None = None) -> Transition:
    if steps is not None and to is not None:
        raise UsageError("give -n or --to, not both")
    with store.locked():
        preflight(store)
        if to is not None:
            return switch(store, specs.resolve(store, to), "rollback")
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


def status(store: StoreDir) -> Status:
    from slm.ops.results import Status

    comp_id = store.active_ref.read()
    entries = store.reflog.read()
    comp = compositions.load(store, comp_id) if comp_id is not None else None
    named = versions.spellings(store, ("tags", "remotes")).get(comp_id or "", [])
    parts = versions.spellings(store, ("bases", "adapters"))
    return Status(None if comp is None else CompositionInfo.of(comp), len(entries.entries),
                  bool(entries.torn_tail), bool(store.journal.pending()), tuple(named),
                  None if comp is None else versions.composition_spec(parts, comp))


def log(store: StoreDir) -> list[LogEntry]:
    """Every transition, newest first, each id with the tags and pulled references naming it."""
    return versions.log_entries(store.reflog.entries(), versions.spellings(store, ("tags", "remotes")))
