"""`slm ls` and `slm show`: read-only views of the store."""

from __future__ import annotations

from slm.compose.base_manifest import parse_base_manifest
from slm.errors import InvalidInput
from slm.ops.resolve import manifest_kind, resolve
from slm.store import Store
from slm.store.names import KINDS


def list_entries(store: Store) -> list[dict]:
    out = []
    for kind in KINDS:
        for name, digest in store.names.items(kind):
            entry = {"kind": kind[:-1], "name": name, "digest": digest}
            if kind == "bases" and store.objects.has(digest):
                try:
                    m = parse_base_manifest(store.objects.read_verified(digest), f"base {name}")
                except Exception as err:  # a broken entry must not hide the others
                    entry["error"] = str(err)
                else:
                    entry.update(
                        source_format=m.source_format, quant_profile=m.quant_profile,
                        tensors=len(m.tensors), bytes=m.total_bytes,
                    )
            out.append(entry)
    return out


def show(store: Store, ref: str) -> dict:
    digest, name = resolve(store, ref)
    data = store.objects.read_verified(digest)
    kind = manifest_kind(data, ref)
    if kind == "slm.base":
        m = parse_base_manifest(data, f"base {ref}")
        return {
            "kind": "base",
            "name": name,
            "digest": digest,
            "source_format": m.source_format,
            "quant_profile": m.quant_profile,
            "qk_row_layout": m.qk_row_layout,
            "architecture": m.architecture,
            "tokenizer": {"digest": m.tokenizer_digest, "source": m.tokenizer_source},
            "total_bytes": m.total_bytes,
            "dtype_counts": m.dtype_counts(),
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "nbytes": t.nbytes,
                 "digest": t.digest}
                for t in m.tensors
            ],
        }
    raise InvalidInput(f"{ref}: unknown manifest kind {kind!r}")
