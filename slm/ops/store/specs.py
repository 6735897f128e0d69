"""The one spec grammar: what a user may type wherever a composition is meant (every verb, the
API and the server), and the one resolver that turns it into a Composition.

    prod                     a tag (`slm tag prod ...`)
    prod@{N}                 what a name pointed at N moves ago (any name: a tag, a base, a
                             pulled reference, or an adapter inside BASE+ADAPTER; versions.py)
    smollm2                  a base name: the base alone
    smollm2+french@0.8+...   a base and adapters (names, digests or prefixes) with weights
    3f2a9c...                a composition id or a unique prefix of one (6+ hex digits)
    @active, @active~N       the active composition, the one N transitions before it
    HOST/repo:tag            what `slm pull HOST/repo:tag` received (recorded as a name)
    -f manifest.toml         a composition manifest, where a verb takes a file

A malformed `@active~N` or `NAME@{N}` (not a count of ASCII digits) is InvalidInput; one past
its log NotFound. Names win over ids (as in resolve.resolve). A spec that names nothing fails
with NotFound and the close names ("did you mean"). Resolving writes nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

from slm.compose.composition import Composition
from slm.errors import InvalidInput, NotFound
from slm.ops.infer import compositions
from slm.ops.store import naming, versions
from slm.ops.store.suggest import did_you_mean
from slm.store import StoreDir

_ACTIVE = re.compile(r"@active(?:~([0-9]{1,%d}))?" % versions.MAX_DIGITS)
FORMS = ("a tag, a base, BASE+ADAPTER[@WEIGHT]..., a composition id, @active[~N], NAME@{N} "
         "or a pulled HOST/repo:tag")


def is_name(store: StoreDir, kind: str, name: str) -> bool:
    return name_target(store, kind, name) is not None


def name_target(store: StoreDir, kind: str, name: str) -> str | None:
    try:
        return store.names.get(kind, name)
    except InvalidInput:  # not a valid name of that kind: some other form
        return None


def active_back(store: StoreDir, steps: int) -> str:
    """The id of the composition active `steps` transitions ago (0: now), from the reflog."""
    if steps == 0:
        return compositions.active_id(store, "activate a composition or name one")
    entries = store.reflog.entries()
    if steps > len(entries):
        raise NotFound(f"@active~{steps}: the log has {len(entries)} transitions")
    target = entries[-steps].old
    if target is None:
        raise NotFound(f"@active~{steps}: nothing was active then")
    return target


def remote_name(reference: str) -> str | None:
    """The canonical form of a registry reference (the name a pull records), None if `reference`
    is not one."""
    from slm.distribution.reference import parse_reference

    try:
        return str(parse_reference(reference))
    except InvalidInput:
        return None


def resolve_id(store: StoreDir, spec: str) -> str | None:
    """The id of a stored composition `spec` names without composing one (a tag, @active[~N],
    a pulled reference, an id or prefix); None if it names none of these."""
    found = _ACTIVE.fullmatch(spec)
    if found:
        return active_back(store, int(found.group(1) or 0))
    if spec.startswith("@active~"):
        raise InvalidInput(f"{spec!r}: N in @active~N must be a whole number of at most "
                           f"{versions.MAX_DIGITS} ASCII digits")
    versioned = versions.split(spec)
    if versioned is not None:
        return _version_id(store, *versioned)
    comp_id = name_target(store, "tags", spec)
    if comp_id is not None:
        return comp_id
    if "/" in spec:
        canonical = remote_name(spec)
        comp_id = name_target(store, "remotes", canonical) if canonical else None
        if comp_id is None:
            raise NotFound(f"nothing was pulled as {spec!r} into this store (run `slm pull {spec}`)"
                           + did_you_mean(spec, [n for n, _ in store.names.items("remotes")]))
        return comp_id
    if name_target(store, "bases", spec) is not None or "+" in spec:
        return None
    try:
        return compositions.find_id(store, spec)
    except NotFound:
        return None


def _version_id(store: StoreDir, name: str, n: int) -> str | None:
    """The composition id a tag's or a pulled reference's version names; None for another
    kind's (a base's version is composed like a base)."""
    if "/" in name:
        name = remote_name(name) or name
    found = versions.resolve(store, name, n, ("tags", "remotes"))
    return found[0] if found is not None else None


def resolve(store: StoreDir, spec: str | None, file: Path | None = None,
            hint: str = "name a composition") -> Composition:
    """The composition a spec names (None: the active one; `file`: a manifest); writes nothing."""
    if file is not None:
        if spec is not None:
            raise InvalidInput("give either -f FILE or a composition, not both")
        return compositions.from_file(file)
    if spec is None:
        return compositions.load_active(store, hint)
    comp_id = resolve_id(store, spec)
    if comp_id is not None:
        return compositions.load(store, comp_id)
    if "+" in spec:
        base, *adapters = spec.split("+")
        if not base or any(not a for a in adapters):
            raise InvalidInput(f"{spec!r}: a composition spec is BASE+ADAPTER[@WEIGHT]+... with no empty part")
        return compositions.build(store, base, adapters)
    bare = spec.partition("@{")[0]
    if naming.kinds_of(store, bare) == ["adapters"]:
        raise InvalidInput(f"{spec!r} is an adapter, not a composition: name it with its base (BASE+{spec})")
    try:
        return compositions.build(store, spec, [])  # a base by name, digest or prefix: the base alone
    except NotFound:
        pass
    raise NotFound(f"no composition, tag or base named {spec!r} ({FORMS})"
                   + did_you_mean(spec, naming.all_names(store)))
