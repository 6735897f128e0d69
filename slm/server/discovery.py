"""Discovery: what /v1/models lists.

/v1/models lists every base and every composition the store names (what `slm ls --json`
lists, through slm.Store.ls), the compositions this server staged on request, and `active`.
A model's id is what a request's `model` accepts: a base's name, a composition's spec
BASE+ADAPTER@W+... when the names still resolve to that very composition (else its blake3
id), and "active". `created` is when the store committed the name (unix seconds).
"""

from __future__ import annotations

from slm import NotFound, SlmError
from slm.server.catalog import Catalog

OWNER = "slm"


def _model(model_id: str, created: int | None, kind: str, comp_id: str | None, base: str | None,
           adapters: list[dict], active: bool) -> dict:
    return {"id": model_id, "object": "model", "created": created or 0, "owned_by": OWNER,
            "slm": {"kind": kind, "composition": comp_id, "base": base, "adapters": adapters, "active": active}}


def _adapters(comp) -> list[dict]:
    return [{"name": a.name, "digest": a.digest, "weight": a.weight} for a in comp.adapters]


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


def list_models(catalog: Catalog) -> list[dict]:
    """Every model a request can name, `active` first, each id once: a composition of a base
    alone, which its spec names by the base's name, is that base's entry."""
    store = catalog.store
    entries = store.ls()
    active_id = catalog.active.id if catalog.active is not None else None
    created_of = {e["digest"]: e.get("created") for e in entries if e["kind"] in ("base", "composition")}
    out: list[dict] = []
    if catalog.active is not None:
        comp = catalog.active.composition
        out.append(_model("active", created_of.get(comp.id), "active", comp.id, comp.base_name or comp.base,
                          _adapters(comp), True))
    bases: dict[str, dict] = {}
    seen: set[str] = set()
    for e in entries:
        if "error" in e:
            continue  # a damaged entry: `slm ls` reports it, a model list cannot offer it
        if e["kind"] == "base":
            bases[e["name"]] = _model(e["name"], e.get("created"), "base", None, e["name"], [], False)
            out.append(bases[e["name"]])
        elif e["kind"] == "composition":
            try:
                comp = store.composition(e["digest"])
            except SlmError:
                continue
            seen.add(comp.id)
            model_id = _spec(catalog, comp)
            if model_id in bases:
                bases[model_id]["slm"].update(composition=comp.id, active=comp.id == active_id)
                continue
            out.append(_model(model_id, e.get("created"), "composition", comp.id,
                              comp.base_name or comp.base, _adapters(comp), comp.id == active_id))
    for info in catalog.runtime.staged():  # asked for by spec, never stored
        if info.id in seen:
            continue
        if not info.adapters and _spec(catalog, info) in bases:  # a base, named by its name
            bases[info.base_name]["slm"].update(composition=info.id, active=info.id == active_id)
        else:
            out.append(_model(info.id, None, "composition", info.id, info.base_name or info.base, _adapters(info),
                              info.id == active_id))
    return out


def find_model(catalog: Catalog, model_id: str) -> dict:
    """GET /v1/models/{id}: the listed model with that id, or one a request could name (a
    composition id or prefix, a spec); NotFound otherwise."""
    for m in list_models(catalog):
        if m["id"] == model_id or m["slm"]["composition"] == model_id:
            return m
    raise NotFound(f"no model {model_id!r}: GET /v1/models lists them")
