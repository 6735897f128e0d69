"""`slm export REF -o OUT [--format slm|gguf-lora|peft]`: read the store, write files; the store
is never changed.

    slm        an OCI image layout (directory, or a tar when OUT ends in .tar): slm.ops.ship.bundles
    gguf       a base as the GGUF file it was imported from, byte for byte
               (slm.distribution.gguf_rebuild)
    gguf-lora  one LoRA adapter as llama.cpp loads it (REF: a composition with one adapter, or
               an adapter with --base)
    peft       one LoRA adapter as a PEFT directory (same REF rules)
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from slm.compose.adapter_manifest import parse_adapter_manifest
from slm.distribution import exporters
from slm.formats.base_origin import parse_origin_record
from slm.errors import Incompatible, InvalidInput
from slm.ops.ship import bundles
from slm.ops.store import specs
from slm.ops.progress import Progress
from slm.ops.store.resolve import load_base, resolve
from slm.ops.results import AdapterExportResult, BaseExportResult, ExportResult
from slm.store import StoreDir, outputs
from slm.store import digest as dg


def _adapter_and_base(store: StoreDir, ref: str | None, base_ref: str | None):
    comp = None
    if ref is None or not specs.is_name(store, "adapters", ref):
        comp = specs.resolve(store, ref, hint="name a composition, or an adapter with --base")
    if comp is not None:
        if base_ref is not None:
            raise InvalidInput("--base goes with an adapter; a composition names its own base")
        if len(comp.adapters) != 1:
            raise Incompatible(f"composition {dg.short(comp.id)} has {len(comp.adapters)} adapters; "
                               "this format holds one: export an adapter with --base")
        a = comp.adapters[0]
        base_digest, base = load_base(store, comp.base)
        return a.digest, a.name or dg.short(a.digest), base_digest, base, a.weight
    if base_ref is None:
        raise InvalidInput(f"exporting adapter {ref!r} needs --base BASE (its q/k row layout and names "
                           "depend on the base's architecture)")
    digest, name = resolve(store, ref, ("adapters",))
    base_digest, base = load_base(store, base_ref)
    return digest, name or ref, base_digest, base, 1.0


def base_origin(store: StoreDir, base_digest: str) -> str | None:
    """Where the base was imported from (slm.formats.base_origin): its Hub id if the checkpoint
    recorded one, else the path; None for a base this store received (pull, bundle) or imported
    before slm kept origins."""
    record = store.names.get("origins", dg.hex_of(base_digest))
    if record is None or not store.objects.has(record):
        return None
    origin = parse_origin_record(store.objects.read_verified(record), f"origin of base {dg.short(base_digest)}")
    return origin["hub_id"] or origin["path"]


class _Hashed:
    """An output that hashes what it is given on its way (the export's sha256, reported)."""

    def __init__(self, target):
        self.target, self.sha256 = target, hashlib.sha256()

    def write(self, data) -> int:
        self.sha256.update(data)
        return self.target.write(data)


def _export_base_gguf(store: StoreDir, ref: str | None, out: Path) -> BaseExportResult:
    if ref is None:
        raise InvalidInput("name the base to export as GGUF")
    from slm.distribution.gguf_rebuild import base_gguf_plan, iter_base_gguf

    started = time.perf_counter()
    digest, manifest = load_base(store, ref)
    plan = base_gguf_plan(store, digest, manifest)  # refused before anything is written
    with outputs.OutputFile(out, store.root, "export -o") as target:
        hashed = _Hashed(target)
        for chunk in iter_base_gguf(store, digest, plan):
            hashed.write(chunk)
        target.commit()
    return BaseExportResult("gguf", str(out), digest, plan.size, hashed.sha256.hexdigest(), plan.exact,
                            round(time.perf_counter() - started, 3))


def export(store: StoreDir, ref: str | None, out: Path, fmt: str = "slm", base: str | None = None,
           tag: str | None = None, progress: Progress | None = None) -> ExportResult | AdapterExportResult | BaseExportResult:
    if fmt not in exporters.FORMATS:
        raise InvalidInput(f"--format {fmt!r}: choose one of {', '.join(exporters.FORMATS)}")
    if fmt == "slm":
        if base is not None:
            raise InvalidInput("--base applies to --format gguf-lora and peft")
        return bundles.export_bundle(store, ref, Path(out), tag, progress)
    if tag is not None:
        raise InvalidInput("--tag applies to --format slm")
    if fmt == "gguf":
        if base is not None:
            raise InvalidInput("--base applies to --format gguf-lora and peft; name the base itself")
        return _export_base_gguf(store, ref, Path(out))
    started = time.perf_counter()
    digest, name, base_digest, base_manifest, weight = _adapter_and_base(store, ref, base)
    manifest = parse_adapter_manifest(store.objects.read_verified(digest), f"adapter {name}")
    from slm import arch as archs

    # the guarded output path (slm.store.outputs): outside the store, temp + fsync + rename
    if fmt == "gguf-lora":
        with outputs.OutputFile(Path(out), store.root, "export -o") as target:
            layout = archs.get(base_manifest.architecture["family"]).gguf_qk_row_layout
            targets = exporters.lora_targets(store.objects, manifest, base_manifest, layout, f"adapter {name}")
            details = exporters.write_gguf_lora(target, manifest, targets, base_manifest)
            target.commit()
    else:
        with outputs.OutputDirectory(Path(out), store.root, "export -o") as target:
            targets = exporters.lora_targets(store.objects, manifest, base_manifest, "hf", f"adapter {name}")
            details = exporters.write_peft(target, targets, base_manifest, base_origin(store, base_digest))
            target.commit()
    return AdapterExportResult(fmt, str(out), name, base_digest, weight, details,
                               round(time.perf_counter() - started, 3))
