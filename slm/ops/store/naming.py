"""Names are refs with a history: `slm tag`, `slm rm`, `slm mv`, `slm log NAME`, and the one
step that moves a name (an import under a taken name uses it too).

A name (base, adapter, tag, pulled registry reference) points at an immutable object; moving
it is a store transaction like an activation:

    journal intent -> (a composition record a tag needs, durable) -> the name's reflog line
    (THE COMMIT POINT) -> names/<kind>/<name> replaced or removed -> journal cleared

A failure before the reflog line is durable is undone (the line cut back, a record this
transaction created removed); after it, the move is committed and `slm fsck --repair` finishes
it from the intent and the log (`recover`). Objects are never touched: the old target stays
reachable through the name's reflog until `gc.reflog_expiry` (slm.ops.store.gc).
"""

from __future__ import annotations

from typing import Callable

from slm.compose.composition import Composition, stamped
from slm.errors import InUse, InvalidInput, NeedsRecovery, NotFound, SlmError
from slm.ops.results import NameMove
from slm.ops.store.resolve import MIN_PREFIX, reads_as_digest
from slm.ops.store import versions
from slm.ops.store.suggest import did_you_mean
from slm.ops.store.versions import KIND_LABEL
from slm.store import StoreDir, fs
from slm.store import digest as dg
from slm.store.journal import Intent, intent_name
from slm.store.names import NAMED_KINDS, file_name, name_of_file
from slm.store.reflog import Reflog, ReflogState
from slm.store.transaction import Recovery, Seen, Transaction

KIND = "name"  # journal/name-<kind>-<name as its file is named>.intent

# ops whose line records that the name went away (its new digest is `-`)
DELETING_OPS = ("rm", "mv-away")
# kinds that may not share a name: a bare spec is read as a tag by some verbs and as a base by
# others, and rm/mv/log could not tell which one is meant (a base and an adapter may: a spec
# says which is which by its position, BASE+ADAPTER)
KEPT_APART = {"tags": ("bases", "adapters"), "bases": ("tags",), "adapters": ("tags",)}


def open_log(store: StoreDir, kind: str, name: str) -> tuple[Reflog, ReflogState]:
    """A name's reflog and its state; NeedsRecovery if a crash tore its last line."""
    log = store.names.log(kind, name)
    state = log.read()
    if state.torn_tail:
        raise NeedsRecovery(f"the log of {KIND_LABEL[kind]} {name!r} ends with a torn line; "
                            "run `slm fsck --repair`")
    return log, state


def move_steps(store: StoreDir, tx: Transaction, kind: str, name: str, old: str | None,
               new: str | None, op: str, state: ReflogState) -> None:
    """Inside an open transaction: the name's reflog line (the commit point), then its file."""
    tx.commit(lambda: log_line(store, tx, kind, name, old, new, op, state))
    fs.point("name.after-log")
    if new is None:
        store.names.remove(kind, name)
    else:
        store.names.set(kind, name, new)


def log_line(store: StoreDir, tx: Transaction, kind: str, name: str, old: str | None,
             new: str | None, op: str, state: ReflogState | None = None) -> None:
    """Append a name's reflog line inside `tx`, its undo registered first (a receive logs the
    names it sets this way, before its own commit point)."""
    log = store.names.log(kind, name)
    if state is None:
        state = open_log(store, kind, name)[1]
    existed = log.path.exists()
    new_dirs = [d for d in (log.path.parent.parent, log.path.parent) if not d.is_dir()]

    def cut_back() -> None:  # an append whose fsync failed may sit in the page cache
        if not existed:  # a failed first move leaves no log, and no folder it made
            fs.remove_any(log.path)
            for folder in reversed(new_dirs):
                if folder.is_dir() and not any(folder.iterdir()):
                    fs.remove_any(folder)
        elif log.path.stat().st_size > state.intact_size:
            fs.truncate(log.path, state.intact_size)

    tx.on_undo(cut_back)
    for folder in new_dirs:
        fs.mkdir(folder)
    log.append(old, new, op, state)


def log_missing_line(store: StoreDir, kind: str, name: str, old: str | None, new: str | None, op: str) -> None:
    """`slm fsck --repair` finishing a move: its reflog line, unless it is already the last."""
    log = store.names.log(kind, name)
    entries = log.read().entries
    if entries and (entries[-1].old, entries[-1].new, entries[-1].op) == (old, new, op):
        return
    fs.mkdir(log.path.parent.parent)
    fs.mkdir(log.path.parent)
    log.append(old, new, op)


def recover(store: StoreDir, intent: Intent, seen: Seen) -> Recovery:
    """An interrupted move (a tag, rm, mv or a pull's naming) is committed if the name's
    reflog ends with its line: finishing it moves the name file to follow the log. Otherwise
    it is undone: the composition record it created (a tag's) is removed."""
    kind, _, file = intent.key.partition("-")
    name = name_of_file(kind, file) if kind in NAMED_KINDS else None
    if name is None:
        return Recovery(f"journal/{intent.name}.intent: a name intent with a malformed name", "remove it")
    new = None if intent.op in DELETING_OPS else intent.new
    label = f"{KIND_LABEL[kind]} {name!r}"
    try:
        entries = store.names.log(kind, name).read().entries
    except SlmError:
        entries = []
    if entries and (entries[-1].old, entries[-1].new, entries[-1].op) == (intent.old, new, intent.op):
        def finish() -> None:
            if new is None:
                store.names.remove(kind, name)
            else:
                store.names.set(kind, name, new)
        return Recovery(f"interrupted {intent.op} of {label}, committed in its log",
                        "finish it (the name follows its log)", finish)
    if not intent.created:
        return Recovery(f"interrupted {intent.op} of {label}, not committed", "undo it")
    return Recovery(f"interrupted {intent.op} of {label}, not committed",
                    "undo it (remove the composition record it created)",
                    lambda: store.names.remove("compositions", dg.hex_of(intent.new)))


def claim(store: StoreDir, kind: str, name: str) -> None:
    """The checks a name of `kind` passes before a transaction points it somewhere: a valid name;
    if it is new to its kind, not one that reads as a composition id or digest prefix (the id
    would be shadowed: names win over ids); not a name a kind kept apart holds (KEPT_APART).
    Callers make it under the store lock, in the transaction that writes the name: a check made
    before the lock races another process creating the same name."""
    file_name(kind, name)
    if kind != "remotes" and reads_as_digest(name) and store.names.get(kind, name) is None:
        raise InvalidInput(f"invalid name {name!r}: {MIN_PREFIX} or more hex digits read as a composition id "
                           "or digest prefix; choose a name with another character")
    for other in KEPT_APART.get(kind, ()):
        if store.names.get(other, name) is not None:
            raise InvalidInput(f"{name!r} is already the name of {a_label(other)}; "
                               f"{a_label(kind)} needs a name of its own (`slm rm {name}` or choose another)")


def a_label(kind: str) -> str:
    """The label of a kind with its article: a base, an adapter, a tag, a pulled reference."""
    label = KIND_LABEL[kind]
    return ("an " if label[0] in "aeiou" else "a ") + label


def refuse_pending(store: StoreDir) -> None:
    if store.journal.pending():
        raise NeedsRecovery("an earlier transaction was interrupted; run `slm fsck --repair`")


def move(store: StoreDir, kind: str, name: str, new: str | None, op: str,
         prepare: Callable[[Transaction], bool] | None = None) -> NameMove:
    """Point a name at `new` (None: remove it), one journaled transaction. `prepare(tx)` runs
    first inside it (storing what `new` needs, with its undo) and says whether it created the
    record `new` names."""
    with store.locked():
        refuse_pending(store)
        old = store.names.get(kind, name)
        if old == new:
            return NameMove(kind[:-1], name, old, new, False, op)
        if new is not None:
            claim(store, kind, name)
        _, state = open_log(store, kind, name)
        created = prepare is not None and not _record_exists(store, kind, new)
        key = f"{kind}-{file_name(kind, name)}"
        with store.transaction(intent_name(KIND, key), op, new or old, old=old, created=created,
                               done=f"the move of {KIND_LABEL[kind]} {name!r} is committed") as tx:
            if prepare is not None:
                prepare(tx)
            move_steps(store, tx, kind, name, old, new, op, state)
    return NameMove(kind[:-1], name, old, new, True, op)


def _record_exists(store: StoreDir, kind: str, new: str | None) -> bool:
    return new is None or kind not in ("tags", "remotes") or \
        store.names.get("compositions", dg.hex_of(new)) is not None


def store_record(store: StoreDir, tx: Transaction, comp: Composition, op: str) -> None:
    """The composition record a tag or a pulled reference names, stored (if missing) inside
    `tx` with its undo: a composition is named by its id, and its id by its record."""
    hex_id = dg.hex_of(comp.id)
    if store.names.get("compositions", hex_id) is not None:
        return
    new_blobs: list[str] = []
    tx.on_undo(lambda: store.objects.remove_new(new_blobs))
    tx.on_undo(lambda: store.names.remove("compositions", hex_id))
    staging = store.objects.staging()
    try:
        digest = staging.put(stamped(comp, f"slm {op}").to_toml())
        new_blobs.extend(staging.commit())
    finally:
        staging.discard()
    store.names.set("compositions", hex_id, digest)


def tag(store: StoreDir, name: str, comp: Composition) -> NameMove:
    """`slm tag NAME SPEC`: name a composition (validated as activating it would be; the
    signing policy is not asked: a tag runs nothing, and an unsigned composition must be
    stored, e.g. tagged, before `slm sign` can sign it)."""
    from slm.ops.infer import compositions

    with store.locked():  # the name is claimed (by move) under the lock that writes it
        compositions.stage(store, comp, load_overlays=False)
        return move(store, "tags", name, comp.id, "tag", lambda tx: store_record(store, tx, comp, "tag"))


def name_remote(store: StoreDir, reference: str, comp: Composition) -> NameMove:
    """After a pull: the registry reference names what was pulled under it."""
    return move(store, "remotes", reference, comp.id, "pull", lambda tx: store_record(store, tx, comp, "pull"))


def kinds_of(store: StoreDir, name: str, with_history: bool = False) -> list[str]:
    """The kinds that hold `name` now (with_history: or whose log knows it)."""
    out = []
    for kind in NAMED_KINDS:
        try:
            logged = with_history and store.names.log(kind, name).path.is_file() and \
                store.names.log(kind, name).path.stat().st_size > 0
            if logged or store.names.get(kind, name) is not None:
                out.append(kind)
        except InvalidInput:
            continue  # not a valid name of that kind
    return out


def _one_kind(store: StoreDir, name: str, with_history: bool = False) -> str:
    """The kind that holds `name` now (with_history: else the one whose log knows it: a tag
    renamed away from a base's name leaves its log behind, and `slm log` means the base)."""
    kinds = kinds_of(store, name) or (kinds_of(store, name, True) if with_history else [])
    if not kinds:
        raise NotFound(f"no name {name!r}" + did_you_mean(name, all_names(store)))
    if len(kinds) > 1:
        raise InvalidInput(f"{name!r} names a {' and a '.join(KIND_LABEL[k] for k in kinds)}; "
                           "rename one of them first")
    return kinds[0]


def rm(store: StoreDir, name: str, force: bool = False) -> NameMove:
    """`slm rm NAME`: the name goes; its history and the objects stay until gc expires them.
    A base or adapter the active composition or a named one uses is refused (InUse, exit 19)
    unless `force`: the composition would show a digest where the name was."""
    with store.locked():
        kind = _one_kind(store, name)
        users = [] if force else users_of(store, kind, name)
        if users:
            raise InUse(f"{KIND_LABEL[kind]} {name!r} is used by {', '.join(users)}; "
                        f"`slm rm --force {name}` removes the name all the same")
        return move(store, kind, name, None, "rm")


def users_of(store: StoreDir, kind: str, name: str) -> list[str]:
    """What uses a base or an adapter that no other name of its kind points at: the active
    composition, the tags and pulled references whose composition has it."""
    from slm.ops.infer import compositions

    digest = store.names.get(kind, name) if kind in ("bases", "adapters") else None
    if digest is None or any(d == digest for n, d in store.names.items(kind) if n != name):
        return []

    def has_it(comp_id: str) -> bool:
        comp = compositions.load(store, comp_id)
        return comp.base == digest or any(a.digest == digest for a in comp.adapters)
    active = store.active_ref.read()
    out = ["the active composition"] if active is not None and has_it(active) else []
    return out + [f"{KIND_LABEL[other]} {n!r}" for other in ("tags", "remotes")
                  for n, comp_id in store.names.items(other) if has_it(comp_id)]


def mv(store: StoreDir, old_name: str, new_name: str) -> list[NameMove]:
    """`slm mv OLD NEW`: NEW takes OLD's object, then OLD goes (two name transactions: a crash
    between them leaves both names on the object, nothing lost)."""
    with store.locked():
        kind = _one_kind(store, old_name)
        file_name(kind, new_name)  # a valid name, checked before anything moves
        if kinds_of(store, new_name):
            raise InvalidInput(f"{new_name!r} is taken; `slm rm {new_name}` first or choose another name")
        digest = store.names.get(kind, old_name)
        return [move(store, kind, new_name, digest, "mv"), move(store, kind, old_name, None, "mv-away")]


def history(store: StoreDir, name: str) -> list:
    """`slm log NAME`: every move of a name, newest first (a removed name's too), each target
    with the NAME@{N} forms that reach it now."""
    kind = _one_kind(store, name, with_history=True)
    _, state = open_log(store, kind, name)
    return versions.log_entries(state.entries, versions.spellings(store, (kind,)))


def all_names(store: StoreDir) -> list[str]:
    """Every user name, for "did you mean" (damaged name files skipped: fsck reports them)."""
    return sorted({name for kind in NAMED_KINDS for name, digest, _ in store.names.scan(kind) if digest})
