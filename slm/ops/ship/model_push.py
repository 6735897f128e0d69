"""`slm push --as modelpack|docker`: a composition as a model artifact other tools read.

    the base     one GGUF layer: the file it was imported from, byte for byte
                 (slm.distribution.gguf_rebuild), streamed from the verified blobs
    each adapter one GGUF LoRA layer, as `slm export --format gguf-lora` writes it
    the config   slm.distribution.model_artifacts.build: the composition id, each adapter's
                 name and weight

What the format cannot say is refused before anything is uploaded (Incompatible, exit 6), never
dropped: a base with no GGUF file to give back (imported from Hugging Face weights, or received
in a bundle), an adapter that is not a LoRA (IA3, sparse deltas: no GGUF LoRA form), an adapter
weight other than 1 (neither format has one: llama.cpp, Docker Model Runner and Ollama apply a
LoRA at full strength), signatures and signed verify certificates (slm's own; push as slm's
format to carry them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import time

from slm import arch as archs
from slm.compose.adapter_manifest import parse_adapter_manifest
from slm.compose.base_manifest import parse_base_manifest
from slm.distribution import exporters
from slm.distribution import model_artifacts as ma
from slm.distribution.bundle import SHA256, sha256_of
from slm.distribution.gguf_rebuild import base_gguf_plan, iter_base_gguf
from slm.distribution.reference import parse_reference
from slm.distribution.registry import Registry
from slm.errors import Incompatible, InvalidInput
from slm.ops.ship import bundles
from slm.ops.progress import NoProgress, Progress
from slm.ops.results import PushResult
from slm.store import StoreDir
from slm.store import digest as dg


@dataclasses.dataclass
class _Blob:
    layer: ma.OutLayer | None  # None: the config
    data: bytes | None  # None: the base's GGUF, streamed
    size: int
    digest: str


def _refusal(fmt: str, what: str) -> Incompatible:
    return Incompatible(f"{what}; a {fmt} artifact cannot carry it (push as slm's own format: --as slm)")


def _plan(store: StoreDir, comp_ref: str | None, fmt: str, progress: Progress):
    comp, _, _ = bundles.target(store, comp_ref)
    if comp.signatures:
        raise _refusal(fmt, f"composition {dg.short(comp.id)} has {len(comp.signatures)} slm signature(s)")
    if comp.certificates:
        raise _refusal(fmt, f"composition {dg.short(comp.id)} has {len(comp.certificates)} "
                            "signed verify certificate(s)")
    base = parse_base_manifest(store.objects.read_verified(comp.base), f"base {dg.short(comp.base)}")
    gguf = base_gguf_plan(store, comp.base, base)  # Incompatible: no GGUF file to give back
    base_name = comp.base_name or f"base-{dg.short(comp.base, 8)}"
    layout = archs.get(base.architecture["family"]).gguf_qk_row_layout
    adapters = []
    for i, a in enumerate(comp.adapters):
        label = f"adapter {a.name or dg.short(a.digest)}"
        if a.weight != 1.0:
            raise _refusal(fmt, f"{label} has weight {a.weight:g}, and a model artifact applies a LoRA at weight 1")
        manifest = parse_adapter_manifest(store.objects.read_verified(a.digest), label)
        if manifest.kind != "lora":
            raise _refusal(fmt, f"{label} is a {manifest.kind} adapter, which has no GGUF LoRA form")
        out = io.BytesIO()
        exporters.write_gguf_lora(out, manifest, exporters.lora_targets(store.objects, manifest, base, layout, label), base)
        data = out.getvalue()
        name = a.name or f"adapter{i + 1}"
        adapters.append(_Blob(ma.OutLayer(sha256_of(data), len(data), f"{name}.gguf", name, a.weight),
                              data, len(data), sha256_of(data)))
    progress.start("hashing the GGUF", gguf.size)
    sha = hashlib.sha256()
    for chunk in iter_base_gguf(store, comp.base, gguf):
        sha.update(chunk)
        progress.advance(len(chunk))
    progress.finish()
    base_layer = ma.OutLayer(SHA256 + sha.hexdigest(), gguf.size, f"{base_name}.gguf")
    blobs = [_Blob(base_layer, None, gguf.size, base_layer.digest), *adapters]
    manifest, config = ma.build(fmt, [b.layer for b in blobs], comp.id, base_name, base.architecture["family"],
                                base.quant_profile)
    blobs.append(_Blob(None, config, len(config), sha256_of(config)))
    return comp, gguf, blobs, manifest


def push_model(store: StoreDir, reference: str, comp_ref: str | None, fmt: str, insecure: bool = False,
               progress: Progress | None = None) -> PushResult:
    progress = progress or NoProgress()
    started = time.perf_counter()
    if fmt not in ma.FORMATS:
        raise InvalidInput(f"--as {fmt!r}: one of slm, {', '.join(ma.FORMATS)}")
    ref = parse_reference(reference)
    if ref.digest is not None:
        raise InvalidInput(f"{reference}: push to a tag (host/repo:tag), not a digest")
    comp, gguf, blobs, manifest = _plan(store, comp_ref, fmt, progress)
    if ref.tag is None:
        ref = dataclasses.replace(ref, tag=bundles.default_tag(comp))
    registry = Registry(ref, insecure)
    uploaded = sent = 0
    try:
        progress.start("pushing", sum(b.size for b in blobs))
        for b in blobs:
            if not registry.has_blob(b.digest):
                if b.data is None:
                    registry.upload_stream(b.digest, b.size, iter_base_gguf(store, comp.base, gguf))
                else:
                    registry.upload_blob(b.digest, b.data)
                uploaded, sent = uploaded + 1, sent + b.size
            progress.advance(b.size)
        progress.finish()
        registry.put_manifest(ref.tag, manifest)
    finally:
        registry.close()
    return PushResult(str(ref), sha256_of(manifest), comp.id, len(blobs) - 1, uploaded, sent,
                      len(blobs) - uploaded, 0, round(time.perf_counter() - started, 3))
