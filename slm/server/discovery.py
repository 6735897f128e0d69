"""Discovery: what /v1/models lists.

/v1/models lists every name a request's `model` accepts for what the store holds (what `slm ls
--json` lists, through slm.Store.ls) and for the compositions this server staged on request:
`active`, each tag and pulled reference, each base's name, each composition by its spec
BASE+ADAPTER@W+... when the names still resolve to that very composition (else its blake3 id).
Each id once: where two would be equal, the one a request resolves to is listed (a tag before a
base of the same name; a composition of a base alone is that base's entry). Lineage as vLLM
gives it: `root` the base, `parent` the base for a composition with adapters, null for a base.
`created` is when the store committed the name (unix seconds); for a composition only staged,
when the store committed the last of the names its spec is built from.
"""

from __future__ import annotations

from slm import SlmError
from slm.server.catalog import Catalog

OWNER = "slm"
# `slm ls` kinds listed under their own names (a tag, a pulled reference), in the order
# slm.ops.store.specs resolves a name: a tag shadows a base of the same name
NAMED = ("tag", "pulled")


def _model(model_id: str, created: int | None, kind: str, comp, base_name: str | None,
           active_id: str | None) -> dict:
    """An entry; comp: its composition (None for a base never composed alone)."""
    adapters = [] if comp is None else [{"name": a.name, "digest": a.digest, "weight": a.weight}
                                        for a in comp.adapters]
    base = base_name or (comp.base_name or comp.base)
    return {"id": model_id, "object": "model", "created": created or 0, "owned_by": OWNER,
            "root": base, "parent": base if adapters else None,
            "slm": {"kind": kind, "composition": None if comp is None else comp.id, "base": base,
                    "adapters": adapters, "active": comp is not None and comp.id == active_id}}


def _spec(catalog: Catalog, comp) -> str:
    """BASE+NAME@W+... if those names compose to this very composition now, else its id."""
    if not comp.base_name or any(not a.name for a in comp.adapters):
        return comp.id
    spec = "+".join([comp.base_name, *(f"{a.name}@{a.weight:g}" for a in comp.adapters)])
    try:
        same = catalog.store.compose(comp.base_name, [f"{a.name}@{a.weight!r}" for a in comp.adapters]).id == comp.id
    except SlmError:
        same = False
    return spec if same else comp.id


class _Listing:
    """The entries by id, in the order they are added; the first of an id stays."""

    def __init__(self, catalog: Catalog, entries: list[dict]):
        self.catalog = catalog
        self.active_id = None if catalog.active is None else catalog.active.id
        self.by_id: dict[str, dict] = {}
        self.bases: set[str] = set()
        self.created = {(e["kind"], e["name"]): e.get("created") for e in entries}
        self._loaded: dict[str, object] = {}

    def composition(self, comp_id: str):
        if comp_id not in self._loaded:
            self._loaded[comp_id] = self.catalog.store.composition(comp_id)
        return self._loaded[comp_id]

    def add(self, model_id: str, created: int | None, kind: str, comp=None, base_name: str | None = None) -> None:
        self.by_id.setdefault(model_id, _model(model_id, created, kind, comp, base_name, self.active_id))

    def add_composition(self, comp, created: int | None) -> None:
        """By its spec, or its id; a base alone is its base's entry."""
        model_id = _spec(self.catalog, comp)
        base = self.by_id.get(model_id)
        if not comp.adapters and model_id in self.bases and base["slm"]["kind"] == "base":
            base["slm"].update(composition=comp.id, active=comp.id == self.active_id)
            return
        self.add(model_id, created, "composition", comp)

    def names_created(self, comp) -> int | None:
        """When the store committed the last of the names a composition's spec is built from."""
        times = [self.created.get(("base", comp.base_name)),
                 *(self.created.get(("adapter", a.name)) for a in comp.adapters)]
        return None if None in times else max(times)


def _listing(catalog: Catalog) -> _Listing:
    entries = [e for e in catalog.store.ls() if "error" not in e]  # a damaged entry: `slm ls` reports it
    listing = _Listing(catalog, entries)
    stored = {e["digest"]: e for e in entries if e["kind"] == "composition"}
    if catalog.active is not None:
        comp = catalog.active.composition
        listing.add("active", stored.get(comp.id, {}).get("created"), "active", comp)
    for e in entries:
        try:
            if e["kind"] in NAMED:
                listing.add(e["name"], e.get("created"), e["kind"], listing.composition(e["digest"]))
        except SlmError:
            continue
    for e in entries:
        if e["kind"] == "base":
            listing.bases.add(e["name"])
            listing.add(e["name"], e.get("created"), "base", base_name=e["name"])
    for comp_id, e in stored.items():
        try:
            listing.add_composition(listing.composition(comp_id), e.get("created"))
        except SlmError:
            continue
    for info in catalog.runtime.staged():  # asked for by spec, never stored
        if info.id not in stored:
            listing.add_composition(info, listing.names_created(info))
    return listing


def list_models(catalog: Catalog) -> list[dict]:
    """Every model a request can name, `active` first, each id once."""
    return list(_listing(catalog).by_id.values())


def find_model(catalog: Catalog, model_id: str) -> dict:
    """GET /v1/models/{id}: the listed model with that id or composition id; else the
    composition any other spec a request could name resolves to (a composition id or prefix, a
    spec): its entry, or one under that spec; NotFound (InvalidInput for what is no spec) otherwise."""
    listing = _listing(catalog)
    for m in listing.by_id.values():
        if m["id"] == model_id or m["slm"]["composition"] == model_id:
            return m
    comp = catalog.store.composition(model_id)
    same = next((m for m in listing.by_id.values() if m["slm"]["composition"] == comp.id), None)
    if same is not None:
        return same
    listing.add(model_id, listing.names_created(comp), "composition", comp)
    return listing.by_id[model_id]
