"""`slm ls` and `slm show`: read-only views of the store."""

from __future__ import annotations

from slm.compose.adapter_manifest import parse_adapter_manifest
from slm.compose.base_manifest import parse_base_manifest
from slm.errors import InvalidInput, NotFound, SlmError
from slm.compose.composition import Composition
from slm.ops.infer import compositions
from slm.ops.store import specs, versions
from slm.ops.store.resolve import manifest_kind, resolve
from slm.store import StoreDir
from slm.store import digest as dg


def list_entries(store: StoreDir) -> list[dict]:
    """Every name, each with its details or, damaged (its file, or what it names), an "error"
    in their place: one damaged name does not hide the others (`slm ls`, the server's /v1/models)."""
    out = []
    active = store.active_ref.read()
    spelled = versions.spellings(store)

    def comp_details(store: StoreDir, comp_id: str) -> dict:
        c = compositions.load(store, comp_id)
        return {"base": c.base_name or dg.short(c.base),
                "adapters": [f"{a.name}@{a.weight:g}" for a in c.adapters],
                "spec": versions.composition_spec(spelled, c)}
    for kind, label, details in (("bases", "base", _base_details), ("adapters", "adapter", _adapter_details),
                                 ("tags", "tag", comp_details), ("remotes", "pulled", comp_details),
                                 ("compositions", "composition", comp_details)):
        for name, digest, damage in store.names.scan(kind):
            shown = name[:12] if kind == "compositions" else name  # (a composition's name is its id)
            if damage is not None:
                out.append({"kind": label, "name": shown, "digest": None, "created": None, "error": str(damage)})
                continue
            if kind == "compositions":
                digest = dg.PREFIX + name
            entry = _entry(label, shown, digest, store, details, store.names.committed_at(kind, name))
            entry["names"] = spelled.get(digest, [])  # every NAME and NAME@{N} naming it now
            if details is comp_details:
                entry["active"] = digest == active
            out.append(entry)
    return out


def _entry(kind: str, name: str, digest: str, store: StoreDir, details, created: float | None) -> dict:
    # created: when the store committed the name (unix seconds), what /v1/models reports
    entry = {"kind": kind, "name": name, "digest": digest, "created": None if created is None else int(created)}
    try:
        entry.update(details(store, digest))
    except SlmError as err:  # a broken (damaged, unreadable) entry must not hide the others
        entry["error"] = str(err)
    return entry


def _base_details(store: StoreDir, digest: str) -> dict:
    m = parse_base_manifest(store.objects.read_verified(digest))
    return {"source_format": m.source_format, "quant_profile": m.quant_profile,
            "tensors": len(m.tensors), "bytes": m.total_bytes}


def _adapter_details(store: StoreDir, digest: str) -> dict:
    m = parse_adapter_manifest(store.objects.read_verified(digest))
    return {"adapter_kind": m.kind, "source_format": m.source_format, "targets": len(m.targets),
            "rank": m.max_rank, "bytes": m.total_bytes}


def show(store: StoreDir, ref: str) -> dict:
    try:
        digest, name = resolve(store, ref)
    except NotFound:  # any other composition spec (a pulled reference, @active~N, BASE+ADAPTER)
        return show_composition(store, specs.resolve(store, ref))
    if digest in (specs.name_target(store, "tags", ref), specs.name_target(store, "remotes", ref)):
        return show_composition(store, compositions.load(store, digest), ref)
    if store.names.get("compositions", dg.hex_of(digest)) is not None:
        return show_composition(store, digest)
    data = store.objects.read_verified(digest)
    kind = manifest_kind(data, ref)
    if kind == "slm.base":
        return _show_base(parse_base_manifest(data, f"base {ref}"), digest, name)
    if kind == "slm.adapter":
        return _show_adapter(parse_adapter_manifest(data, f"adapter {ref}"), digest, name)
    raise InvalidInput(f"{ref}: unknown manifest kind {kind!r}")


def _show_base(m, digest: str, name: str | None) -> dict:
    return {
        "kind": "base", "name": name, "digest": digest,
        "source_format": m.source_format, "quant_profile": m.quant_profile,
        "qk_row_layout": m.qk_row_layout, "architecture": m.architecture,
        "tokenizer": {"digest": m.tokenizer_digest, "source": m.tokenizer_source},
        "total_bytes": m.total_bytes, "dtype_counts": m.dtype_counts(),
        "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "nbytes": t.nbytes,
                     "digest": t.digest} for t in m.tensors],
    }


def _show_adapter(m, digest: str, name: str | None) -> dict:
    return {
        "kind": "adapter", "name": name, "digest": digest, "adapter_kind": m.kind,
        "source_format": m.source_format, "row_layout": m.row_layout, "requires": m.requires,
        "rank": m.max_rank, "total_bytes": m.total_bytes,
        "targets": [{"module": t.module, "shape": [t.out_features, t.in_features], "rank": t.rank,
                     "scale": t.scale, "ia3_on": t.ia3_on,
                     "tensors": {k: r.digest for k, r in t.tensors.items()}} for t in m.targets],
    }


def show_composition(store: StoreDir, comp: str | Composition, name: str | None = None) -> dict:
    """A composition (an id: the stored one) as `slm show` prints it; `name`: the tag or pulled
    reference it was asked by."""
    c = compositions.load(store, comp) if isinstance(comp, str) else comp
    comp_id = c.id
    return {
        "kind": "composition", "id": comp_id, "name": name, "active": store.active_ref.read() == comp_id,
        "stored": store.names.get("compositions", dg.hex_of(comp_id)) is not None,
        "identity": c.identity(),
        "base_name": c.base_name,
        "adapters": c.adapter_list(),
        "provenance": {"created_at": c.created_at, "created_by": c.created_by},
        "manifest_toml": c.to_toml().decode("utf-8"),
    }
