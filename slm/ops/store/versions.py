"""Versions of a name: NAME@{N}, the target a name had N moves ago, read from its reflog
(logs/names/<kind>/<name>, newest first, as `slm log NAME` lists it: git's `ref@{N}`).

    prod@{0}     what prod points at now (the name itself)
    prod@{1}     what prod pointed at before its last move
    french@{2}   the adapter french two imports ago (in a spec: BASE+french@{2}@0.8)

A version past the log is NotFound (exit 3) saying how many entries the log has; a malformed
one (`prod@{x}`, `prod@{-1}`, more than MAX_DIGITS digits) is InvalidInput (exit 4), as a
malformed `@active~N` is. `spellings` is the other direction: every NAME and NAME@{N} that
names a digest now (what `slm ls`, `status` and `log` print beside an id).
"""

from __future__ import annotations

import re

from slm.errors import InvalidInput, NotFound
from slm.store import StoreDir
from slm.store import digest as dg
from slm.store.names import NAMED_KINDS

KIND_LABEL = {"bases": "base", "adapters": "adapter", "tags": "tag", "remotes": "pulled reference"}
MAX_DIGITS = 9  # as @active~N: a count no log reaches
_VERSIONED = re.compile(r"(.+)@\{(.*)\}")


def split(ref: str) -> tuple[str, int] | None:
    """'prod@{2}' -> ('prod', 2); None for a ref with no version (or a composed spec, whose
    parts are read one by one); InvalidInput if malformed."""
    if "+" in ref:
        return None
    found = _VERSIONED.fullmatch(ref)
    if found is None:
        if "@{" in ref:
            raise InvalidInput(f"{ref!r}: a version is written NAME@{{N}}, N a whole number (prod@{{1}})")
        return None
    digits = found.group(2)
    if not (digits.isascii() and digits.isdigit() and len(digits) <= MAX_DIGITS):
        raise InvalidInput(f"{ref!r}: N in NAME@{{N}} must be a whole number of at most {MAX_DIGITS} "
                           "ASCII digits (0: the name itself, 1: its previous target)")
    return found.group(1), int(digits)


def target(store: StoreDir, kind: str, name: str, n: int) -> str | None:
    """The digest `name` (of `kind`) pointed at `n` moves ago; None if no such name of that
    kind ever was (nor a valid one). NotFound past its log or where the name did not exist."""
    try:
        current = store.names.get(kind, name)
        entries = store.names.log(kind, name).entries()
    except InvalidInput:
        return None
    if current is None and not entries:
        return None
    label = f"{KIND_LABEL[kind]} {name!r}"
    if n == 0:
        if current is None:
            raise NotFound(f"{name}@{{0}}: {label} was removed (`slm log {name}` shows its history)")
        return current
    if n >= len(entries):
        raise NotFound(f"{name}@{{{n}}}: the log of {label} has {len(entries)} "
                       f"{'entry' if len(entries) == 1 else 'entries'}"
                       + (f" ({name}@{{0}} to {name}@{{{len(entries) - 1}}})" if entries else ""))
    entry = entries[-1 - n]
    if entry.new is None:
        raise NotFound(f"{name}@{{{n}}}: {label} did not exist then (entry {entry.seq} removed it)")
    return entry.new


def resolve(store: StoreDir, name: str, n: int, kinds: tuple[str, ...]) -> tuple[str, str] | None:
    """(digest, kind) of NAME@{N} among `kinds`, the object still stored; None if no name of
    those kinds is called `name`."""
    for kind in kinds:
        if kind not in NAMED_KINDS:
            continue
        digest = target(store, kind, name, n)
        if digest is None:
            continue
        stored = store.names.get("compositions", dg.hex_of(digest)) is not None \
            if kind in ("tags", "remotes") else store.objects.has(digest)
        if not stored:
            raise NotFound(f"{name}@{{{n}}}: {dg.short(digest)}, what {KIND_LABEL[kind]} {name!r} "
                           "pointed at then, was collected by `slm gc`")
        return digest, kind
    return None


def spellings(store: StoreDir, kinds: tuple[str, ...] = NAMED_KINDS) -> dict[str, list[str]]:
    """digest -> every NAME and NAME@{N} of `kinds` that names it now, each name once at its
    nearest version (damaged name files are skipped: fsck reports them)."""
    out: dict[str, list[str]] = {}
    for kind in kinds:
        current = {name: digest for name, digest, _ in store.names.scan(kind) if digest}
        logs = dict(store.names.logged(kind))
        for name in sorted(set(current) | set(logs)):
            seen: set[str] = set()
            forms = [(current[name], name)] if name in current else []
            entries = logs[name].read().entries if name in logs else []
            forms += [(e.new, f"{name}@{{{n}}}") for n, e in enumerate(reversed(entries)) if n and e.new]
            for digest, form in forms:
                if digest not in seen:
                    seen.add(digest)
                    out.setdefault(digest, []).append(form)
    return out


def composition_spec(spelled: dict[str, list[str]], comp) -> str:
    """A spec naming a composition's parts as the store's names and versions spell them now
    (BASE+ADAPTER@W...; a part no name reaches by its full digest)."""
    def part(digest: str, name: str) -> str:
        forms = spelled.get(digest, [])
        own = [f for f in forms if f == name or f.startswith(name + "@{")]
        return (own or forms or [digest])[0]

    adapters = [part(a.digest, a.name) + ("" if a.weight == 1 else f"@{a.weight!r}") for a in comp.adapters]
    return "+".join([part(comp.base, comp.base_name), *adapters])


def log_entries(entries: list, spelled: dict[str, list[str]]) -> list:
    """A reflog's entries newest first as `slm log` shows them, each id with its spellings."""
    from slm.ops.results import LogEntry

    return [LogEntry(e.seq, e.op, e.old, e.new, e.time, tuple(spelled.get(e.new or "", [])),
                     tuple(spelled.get(e.old or "", []))) for e in reversed(entries)]
