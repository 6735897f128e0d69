"""Turning what a user typed (a name, a digest, a digest prefix) into a stored manifest."""

from __future__ import annotations

from slm.compose.base_manifest import BaseManifest, parse_base_manifest
from slm.compose.toml_io import loads
from slm.errors import InvalidInput, NotFound
from slm.ops.store import versions
from slm.ops.store.suggest import did_you_mean
from slm.store import StoreDir
from slm.store import digest as dg
from slm.store.names import KINDS

MIN_PREFIX = 6  # hex digits of an abbreviated digest or composition id (`slm log` shows 12)


def reads_as_digest(ref: str) -> bool:
    """Whether `ref` is a digest or an abbreviation of one, as by_prefix reads it: at least
    MIN_PREFIX hex digits in either case, `blake3:` optional. A name of this form would stand
    for an id (slm.ops.store.naming.claim refuses to create one)."""
    hex_part = ref.removeprefix(dg.PREFIX).lower()
    return len(hex_part) >= MIN_PREFIX and all(c in "0123456789abcdef" for c in hex_part)


def by_prefix(candidates, ref: str, what: str) -> str | None:
    """The one digest among `candidates` that `ref` (a digest, `blake3:` optional, or at least
    MIN_PREFIX of its hex digits) names; None if none does; InvalidInput if several do. The one
    resolver for abbreviated digests and composition ids."""
    if not reads_as_digest(ref):
        return None
    hex_part = ref.removeprefix(dg.PREFIX).lower()
    matches = sorted({d for d in candidates if dg.hex_of(d).startswith(hex_part)})
    if len(matches) > 1:
        raise InvalidInput(f"{what} prefix {ref!r} is ambiguous ({len(matches)} matches)")
    return matches[0] if matches else None


def resolve(store: StoreDir, ref: str, kinds: tuple[str, ...] = KINDS) -> tuple[str, str | None]:
    """-> (digest, name or None). Names win over digests; a digest prefix must be unique;
    NAME@{N} is a version of a name (slm.ops.store.versions)."""
    versioned = versions.split(ref)
    if versioned is not None:
        found = versions.resolve(store, *versioned, kinds)
        if found is None:
            raise NotFound(f"no {'/'.join(k[:-1] for k in kinds)} named {versioned[0]!r}"
                           + did_you_mean(versioned[0], _known(store, kinds)))
        return found[0], versioned[0]
    for kind in kinds:
        try:
            digest = store.names.get(kind, ref)
        except InvalidInput:
            continue  # not a valid name of this kind; maybe a digest
        if digest is not None:
            return digest, ref
    hex_part = ref.removeprefix(dg.PREFIX).lower()
    if dg.is_digest(dg.PREFIX + hex_part):
        if not store.objects.has(dg.PREFIX + hex_part):
            raise NotFound(f"no object {ref} in the store")
        return dg.PREFIX + hex_part, None
    found = by_prefix({d for kind in kinds for _, d in store.names.items(kind)}, ref, "digest")
    if found is not None:
        return found, None
    kinds_text = "/".join(k[:-1] for k in kinds)
    raise NotFound(f"no {kinds_text} named {ref!r} and no such digest" + did_you_mean(ref, _known(store, kinds)))


def _known(store: StoreDir, kinds: tuple[str, ...]) -> list[str]:
    return [name for kind in kinds if kind != "compositions" for name, _ in store.names.items(kind)]


def manifest_kind(data: bytes, what: str) -> str:
    schema = loads(data, what).get("schema")
    if not isinstance(schema, str) or "/" not in schema:
        raise InvalidInput(f"{what}: not an slm manifest (no schema field)")
    return schema.split("/")[0]


def load_base(store: StoreDir, ref: str) -> tuple[str, BaseManifest]:
    digest, _ = resolve(store, ref, ("bases",))
    data = store.objects.read_verified(digest)
    return digest, parse_base_manifest(data, f"base {ref}")


ACTIVE = "@active"

