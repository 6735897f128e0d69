"""`slm export --format slm` and `slm import bundle`: compositions as OCI image layouts.

Export reads the store (every blob re-hashed as it is read) and writes a layout directory or
tar (slm.distribution.layout); it changes nothing in the store. Import is a receive transaction
(slm.ops.ship.receive), the same one `slm pull` runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from slm.compose.composition import Composition
from slm.distribution import mediatypes as mt
from slm.distribution.bundle import Descriptor, Layer, Manifest, blobs_of, config_bytes, parse_manifest, sha256_of
from slm.distribution.layout import write_layout
from slm.distribution.layout_read import LayoutReader
from slm.errors import IntegrityError, InvalidInput
from slm.ops.infer import compositions
from slm.ops.ship import receive
from slm.ops.store import specs
from slm.ops.progress import NoProgress, Progress
from slm.ops.results import ExportResult, ReceiveResult
from slm.store import StoreDir, outputs
from slm.store import digest as dg


@dataclass
class BundlePlan:
    """Everything a bundle of one composition holds: the OCI manifest, its config and a way to
    read each layer's bytes (verified against its BLAKE3 name when read)."""

    composition: Composition
    record_digest: str
    manifest: Manifest
    manifest_bytes: bytes
    config: bytes
    store: StoreDir
    extra: dict[str, bytes]  # blobs not in the store (a base's composition record)

    @property
    def manifest_digest(self) -> str:
        return sha256_of(self.manifest_bytes)

    def layer_bytes(self, layer: Layer) -> bytes:
        if layer.blake3 in self.extra:
            return self.extra[layer.blake3]
        return self.store.objects.read_verified(layer.blake3)

    @property
    def total_bytes(self) -> int:
        return sum(l.size for l in self.manifest.layers)


def target(store: StoreDir, ref: str | None) -> tuple[Composition, str, dict[str, bytes]]:
    """(composition, record digest, blobs outside the store) for a composition id or prefix, a
    base name (its base-only composition), or nothing (the active composition)."""
    try:
        comp = specs.resolve(store, ref, hint="name a composition or a base")
    except InvalidInput:
        if ref is not None and specs.is_name(store, "adapters", ref):
            raise InvalidInput(f"{ref!r} is an adapter: a bundle holds a composition (base + adapters); "
                               "export the adapter alone with --format gguf-lora or --format peft") from None
        raise
    stored = store.names.get("compositions", dg.hex_of(comp.id))
    if stored is not None:
        return compositions.load(store, comp.id), stored, {}
    record = comp.to_toml()  # composed from a spec, never stored: its record travels in the bundle
    return comp, dg.of_bytes(record), {dg.of_bytes(record): record}


def plan(store: StoreDir, ref: str | None, progress: Progress | None = None) -> BundlePlan:
    progress = progress or NoProgress()
    comp, record, extra = target(store, ref)
    layers = []
    entries = blobs_of(store.objects, comp, record)
    sizes = {d: (len(extra[d]) if d in extra else store.objects.size(d)) for d, _, _ in entries}
    progress.start("hashing blobs", sum(sizes.values()))
    for digest, media, title in entries:
        data = extra[digest] if digest in extra else store.objects.read_verified(digest)
        layers.append(Layer(media, digest, sha256_of(data), len(data), title))
        progress.advance(len(data))
    progress.finish()
    config = config_bytes(comp, record)
    manifest = Manifest(Descriptor(mt.CONFIG, sha256_of(config), len(config)), tuple(layers))
    return BundlePlan(comp, record, manifest, manifest.to_bytes(), config, store, extra)


def default_tag(comp: Composition) -> str:
    return dg.short(comp.id, 12)


def export_bundle(store: StoreDir, ref: str | None, out: Path, tag: str | None = None,
                  progress: Progress | None = None) -> ExportResult:
    progress = progress or NoProgress()
    started = time.perf_counter()
    out = Path(out)
    tar = out.suffix == ".tar"
    # the target is checked and its temporary made before minutes of hashing (slm.store.outputs)
    target = (outputs.OutputFile(out, store.root, "export -o") if tar
              else outputs.OutputDirectory(out, store.root, "export -o"))
    with target:
        return _export_into(store, ref, out, target, tar, tag, progress, started)


def _export_into(store: StoreDir, ref: str | None, out: Path, target, tar: bool, tag: str | None,
                 progress: Progress, started: float) -> ExportResult:
    p = plan(store, ref, progress)
    tag = tag or default_tag(p.composition)

    def writer(data_of):
        return lambda f: f.write(data_of())

    blobs = [(l.sha256, l.size, writer(lambda l=l: _advancing(p.layer_bytes(l), progress))) for l in p.manifest.layers]
    blobs.append((p.manifest.config.digest, len(p.config), writer(lambda: p.config)))
    blobs.append((p.manifest_digest, len(p.manifest_bytes), writer(lambda: p.manifest_bytes)))
    unique = list({b[0]: b for b in blobs}.values())  # two layers may share bytes (same sha256)
    progress.start("writing bundle", p.total_bytes)
    write_layout(target, tar, unique, p.manifest_digest, len(p.manifest_bytes), tag)
    target.commit()
    progress.finish()
    return ExportResult("slm", str(out), p.composition.id, p.manifest_digest, len(unique),
                        sum(b[1] for b in unique), round(time.perf_counter() - started, 3))


def _advancing(data: bytes, progress: Progress) -> bytes:
    progress.advance(len(data))
    return data


class _LayoutSource:
    """A layout's blobs for the receiver: small ones whole, the rest in chunks (each opened only
    if it is a regular file of its descriptor's size; slm.distribution.layout_read)."""

    def __init__(self, reader: LayoutReader):
        self.reader = reader

    def blob(self, digest: str, size: int) -> bytes:
        return self.reader.blob(digest, size)

    def chunks(self, digest: str, size: int):
        with contextlib.closing(self.reader.open_blob(digest, size)) as f:
            yield from f.chunks(size)


def import_bundle(store: StoreDir, path: Path, tag: str | None = None,
                  progress: Progress | None = None) -> ReceiveResult:
    reader = LayoutReader(Path(path))
    try:
        desc = reader.manifest_descriptor(tag)  # its size bounded before the manifest is read
        data = reader.blob(desc.digest, desc.size)
        if sha256_of(data) != desc.digest:
            raise IntegrityError(f"{path}: the manifest does not hash to the digest index.json gives")
        manifest = parse_manifest(data, f"{Path(path).name} manifest")
        result = receive.receive(store, manifest, _LayoutSource(reader), Path(path).name, progress)
        return dataclasses.replace(result, manifest_digest=desc.digest)
    finally:
        reader.close()
