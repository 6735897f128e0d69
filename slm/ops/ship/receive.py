"""Receiving a bundle (`slm import bundle`, `slm pull`): a store transaction exactly like import.

    read the OCI manifest and config -> fetch the composition record and the signatures and
    certificates it lists (each valid for its id; `admit`, given by a pull into a store that
    requires signatures, judges the signatures here, before anything is written) -> the base and adapter
    manifests -> check that the layers are exactly the blobs those manifests name -> fetch
    every other blob the store lacks, each re-hashed (sha256 and size against its descriptor,
    BLAKE3 against its annotation) and staged under tmp/ -> under the store lock: journal
    intent "bundle" -> commit the staged blobs -> set the base and adapter names -> set the
    composition record (THE COMMIT POINT) -> clear the intent.

Nothing is visible before every byte is verified. A failure before the record is set is
undone before the command returns (blobs and names it added removed, intent cleared). A crash
is recovered by `slm fsck --repair` (`recover`): if every blob the record names is stored it
finishes the transaction (names, record), else it clears the intent (the blobs are junk for
`slm gc`): old or new, never a mix.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Protocol

from slm.compose.adapter_manifest import AdapterManifest, parse_adapter_manifest
from slm.compose.base_manifest import BaseManifest, parse_base_manifest
from slm.compose.composition import Composition, architecture_digest, parse_composition
from slm.distribution import mediatypes as mt
from slm.distribution import signing
from slm.distribution.bundle import SHA256, Descriptor, Layer, Manifest, parse_config, sha256_of
from slm.errors import IntegrityError, InvalidInput, SlmError
from slm.ops.infer import compositions
from slm.ops.store import naming
from slm.ops.progress import NoProgress, Progress
from slm.ops.results import ReceiveResult
from slm.store import StoreDir, fs
from slm.store import digest as dg
from slm.store.journal import Intent, intent_name
from slm.store.transaction import Recovery, Seen

OP = KIND = "bundle"  # the op and the kind of journal/bundle-<composition hex>.intent
WINDOW = 16  # small blobs fetched ahead of staging
AHEAD_MAX = 1 << 20  # the largest blob fetched ahead whole; a larger one is streamed when its turn comes


class BlobSource(Protocol):
    """Where a bundle's blobs come from (a layout on disk, a registry).

    `blob` gives a small blob whole (at most `size` bytes: the config, a manifest, a signature,
    each bounded by its kind before it is asked for, or a layer of at most AHEAD_MAX bytes).
    `chunks` gives any blob in pieces (an iterator of at most `size` + 1 bytes in all,
    closable): the receiver streams the layers into the store with it, hashing on the way.
    A source with `workers` > 1 is asked for small layers whole on that many threads."""

    def blob(self, digest: str, size: int) -> bytes: ...

    def chunks(self, digest: str, size: int) -> Iterator[bytes]: ...


Admit = Callable[[str, list[bytes]], None]


def names_of(comp: Composition) -> list[tuple[str, str, str]]:
    """(kind, name, digest) of every name a received composition sets."""
    out = [("bases", comp.base_name, comp.base)] if comp.base_name else []
    return out + [("adapters", a.name, a.digest) for a in comp.adapters if a.name]


def expected_blobs(comp: Composition, record: str, base: BaseManifest,
                   adapters: list[AdapterManifest]) -> dict[str, str]:
    """blake3 digest -> media type of every blob a bundle of `comp` must hold."""
    out = {record: mt.COMPOSITION, comp.base: mt.BASE_MANIFEST, base.tokenizer_digest: mt.TOKENIZER}
    out.update({t.digest: mt.TENSOR for t in base.tensors if t.digest not in out})
    for ref, manifest in zip(comp.adapters, adapters):
        out.setdefault(ref.digest, mt.ADAPTER_MANIFEST)
        out.update({d: mt.TENSOR for d in manifest.blob_digests() if d not in out})
    out.update({s: mt.SIGNATURE for s in comp.signatures if s not in out})
    out.update({c: mt.CERTIFICATE for c in comp.certificates if c not in out})
    return out


def _check_received(where: str, digest: str, size: int, blake3: str | None, got_size: int,
                    got_sha256: str, got_blake3: str | None) -> None:
    """The one verdict on a received blob's bytes (whole or streamed): exit 5 unless its size,
    sha256 and (for a layer) BLAKE3 are those its descriptor and annotation give."""
    if got_size != size:
        raise IntegrityError(f"{where}: blob {digest[:19]} is {got_size} bytes, its descriptor says {size}")
    if got_sha256 != digest:
        raise IntegrityError(f"{where}: blob {digest[:19]} does not hash to its sha256 digest (tampered or damaged)")
    if blake3 is not None and got_blake3 != blake3:
        raise IntegrityError(f"{where}: blob {digest[:19]} does not hash to the BLAKE3 digest its annotation "
                             f"claims ({dg.short(blake3)})")


def _checked(data: bytes, layer: Layer | Descriptor, blake3: str | None, where: str) -> bytes:
    digest = layer.sha256 if isinstance(layer, Layer) else layer.digest
    _check_received(where, digest, layer.size, blake3, len(data), sha256_of(data),
                    dg.of_bytes(data) if blake3 is not None else None)
    return data


class Receiver:
    def __init__(self, store: StoreDir, manifest: Manifest, source: BlobSource, where: str, progress: Progress,
                 admit: Admit | None = None):
        self.store, self.manifest, self.source, self.where = store, manifest, source, where
        self.progress = progress
        self.admit = admit
        self.layers = {l.blake3: l for l in manifest.layers}
        self.downloaded = 0
        self.bytes = 0
        self.staging = store.objects.staging()
        self._count_lock = threading.Lock()

    def _stored(self, digest: str) -> bool:
        """Whether the store already holds these bytes (re-hashed: existence is not proof)."""
        if not self.store.objects.has(digest):
            return False
        if not self.store.objects.verify(digest):
            raise IntegrityError(f"blob {dg.short(digest)} exists in the store but is corrupt; "
                                 "run `slm fsck --repair` first")
        self.staging.reused.add(digest)
        return True

    def fetch(self, layer: Layer) -> bytes:
        data = _checked(self.source.blob(layer.sha256, layer.size), layer, layer.blake3, self.where)
        with self._count_lock:  # fetches run on the source's threads
            self.downloaded += 1
            self.bytes += len(data)
            self.progress.advance(len(data))
        return data

    def ingest(self, layer: Layer, chunks) -> None:
        """Stage one layer from its bytes as they arrive: size, sha256 and BLAKE3 checked on the
        way (a longer blob is refused at its first extra byte), nothing held whole; a blob that
        fails any check leaves nothing staged."""
        digest = layer.sha256
        with self.staging.incoming() as blob:
            n, sha = copy_bounded(chunks, blob, layer.size, digest, self.where, self.progress)
            _check_received(self.where, digest, layer.size, layer.blake3, n, sha, blob.digest)
            blob.keep()
        self.downloaded += 1
        self.bytes += n

    def _chunks_ahead(self, layers: list[Layer]):
        """(layer, its bytes in chunks), in order. A source with `workers` > 1 (a registry, where
        each blob costs a round trip) is asked for the small layers (at most AHEAD_MAX bytes)
        whole, up to WINDOW ahead, on its threads; every other layer is streamed from the
        source on this thread when its turn comes. So at most WINDOW x AHEAD_MAX bytes of
        layers are held, whatever their sizes, and every write to the store stays on this thread."""
        workers = getattr(self.source, "workers", 1)
        pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
        todo, pending = iter(layers), deque()
        try:
            while True:
                while len(pending) < WINDOW and (layer := next(todo, None)) is not None:
                    ahead = pool is not None and layer.size <= AHEAD_MAX
                    pending.append((layer, pool.submit(self.source.blob, layer.sha256, layer.size) if ahead else None))
                if not pending:
                    return
                layer, fetched = pending.popleft()
                if fetched is not None:
                    yield layer, (fetched.result(),)
                else:
                    with contextlib.closing(self.source.chunks(layer.sha256, layer.size)) as chunks:
                        yield layer, chunks
        finally:
            if pool is not None:  # a failure: what is not yet asked for never will be
                pool.shutdown(wait=True, cancel_futures=True)

    def small(self, digest: str, media: str, what: str) -> bytes:
        """The verified bytes of a small blob (a manifest, a signature), from the store or the
        source; not staged yet."""
        layer = self.layers.get(digest)
        if layer is None:
            raise IntegrityError(f"{self.where}: the bundle has no layer for {what} ({dg.short(digest)})")
        if layer.media_type != media:
            raise InvalidInput(f"{self.where}: {what} has mediaType {layer.media_type!r}, expected {media!r}")
        if self._stored(digest):
            return self.store.objects.read_verified(digest)
        return self.fetch(layer)

    def content(self, digest: str, media: str, what: str) -> bytes:
        """A small blob's verified bytes, staged unless the store has them."""
        data = self.small(digest, media, what)
        self.staging.put(data)
        return data

    def _merged_record(self, comp: Composition, record: str) -> str:
        """The record to set: the bundle's, unless the store already has a record of this id;
        then the local one is kept (its provenance), gaining the bundle's signatures and
        certificates."""
        existing = self.store.names.get("compositions", dg.hex_of(comp.id))
        if existing is None or existing == record:
            return record
        try:
            local = compositions.load(self.store, comp.id)
        except SlmError:
            return record  # a damaged local record is replaced by the verified one
        merged = local.with_signatures(dict.fromkeys((*local.signatures, *comp.signatures))) \
            .with_certificates(dict.fromkeys((*local.certificates, *comp.certificates)))
        if merged == local:
            return existing
        return self.staging.put(merged.to_toml())

    def run(self) -> ReceiveResult:
        started = time.perf_counter()
        cfg = self.manifest.config
        config = parse_config(_checked(self.source.blob(cfg.digest, cfg.size), cfg, None, self.where),
                              f"{self.where} config")
        self.downloaded += 1
        self.bytes += cfg.size
        self.progress.start("receiving", sum(l.size for l in self.manifest.layers))
        record = config.composition_manifest
        record_bytes = self.small(record, mt.COMPOSITION, "the composition record")
        comp = parse_composition(record_bytes, f"{self.where} composition record")
        if comp.id != config.composition_id:
            named, record_id = dg.short_pair(config.composition_id, comp.id)
            raise IntegrityError(f"{self.where}: the config names composition {named} "
                                 f"but the record is composition {record_id}")
        if comp.identity() != config.identity:
            raise IntegrityError(f"{self.where}: the config's identity of composition {dg.short(comp.id)} "
                                 "is not the one its record hashes to")
        # the signatures it carries (small), each valid for this id, before anything is staged:
        # so the admission check sees them while the store is still untouched
        signatures = [self.small(s, mt.SIGNATURE, f"signature {dg.short(s)}") for s in comp.signatures]
        for data in signatures:
            signing.parse_signature(data, comp.id)
        certificates = [self.small(c, mt.CERTIFICATE, f"certificate {dg.short(c)}") for c in comp.certificates]
        for digest, data in zip(comp.certificates, certificates):
            signing.check_certificate_of(data, comp.id, f"{self.where} certificate {dg.short(digest)}")
        if self.admit is not None:
            self.admit(comp.id, signatures)
        for data in (record_bytes, *signatures, *certificates):
            self.staging.put(data)
        base = parse_base_manifest(self.content(comp.base, mt.BASE_MANIFEST, "the base manifest"),
                                   f"{self.where} base manifest")
        _check_base(comp, base, self.where)
        adapters = [parse_adapter_manifest(self.content(a.digest, mt.ADAPTER_MANIFEST, f"adapter {a.name}"),
                                           f"{self.where} adapter {a.name}") for a in comp.adapters]
        expected = expected_blobs(comp, record, base, adapters)
        for digest, media in expected.items():
            layer = self.layers.get(digest)
            if layer is None:
                raise IntegrityError(f"{self.where}: the bundle lacks blob {dg.short(digest)} that its manifests name")
            if layer.media_type != media:
                raise InvalidInput(f"{self.where}: layer {dg.short(digest)} has mediaType {layer.media_type!r}, "
                                   f"expected {media!r}")
        extra = [d for d in self.layers if d not in expected]
        if extra:
            raise InvalidInput(f"{self.where}: layer {dg.short(extra[0])} is not named by the composition")
        wanted = []
        for digest, layer in self.layers.items():
            if digest in self.staging.staged or digest in self.staging.reused:
                continue
            if self._stored(digest):
                self.progress.advance(layer.size)
                continue
            wanted.append(layer)
        with contextlib.closing(self._chunks_ahead(wanted)) as blobs:
            for layer, chunks in blobs:
                self.ingest(layer, chunks)  # staged in order, on this thread
        self.progress.finish()
        record = self._merged_record(comp, record)
        fs.point("bundle.staged")
        new = commit(self.store, comp, record, self.staging)
        reused = len(self.staging.reused)
        return ReceiveResult(comp.id, record, comp.base_name, tuple(a.name for a in comp.adapters),
                             len(comp.signatures), len(self.layers), self.downloaded, self.bytes, reused,
                             len(new), round(time.perf_counter() - started, 3), self.where,
                             certificates=len(comp.certificates))


def _check_base(comp: Composition, base: BaseManifest, where: str) -> None:
    if (base.tokenizer_digest, architecture_digest(base), base.quant_profile) != \
            (comp.tokenizer, comp.architecture, comp.quant_profile):
        raise IntegrityError(f"{where}: the base manifest does not match the composition's tokenizer, "
                             "architecture or quantization profile")


def receive(store: StoreDir, manifest: Manifest, source: BlobSource, where: str,
            progress: Progress | None = None, admit: Admit | None = None) -> ReceiveResult:
    """`admit(composition id, the signature blobs it carries)` raises to refuse the composition
    before anything is staged (a pull into a store that requires signatures)."""
    receiver = Receiver(store, manifest, source, where, progress or NoProgress(), admit)
    try:
        return receiver.run()
    finally:
        receiver.staging.discard()


def commit(store: StoreDir, comp: Composition, record: str, staging,
           side_names: tuple[tuple[str, str, str], ...] = ()) -> list[str]:
    """Under the store lock: intent, blobs, names, composition record (the commit point).
    `side_names` ((kind, name, digest) of slm.store.names.SIDE_KINDS: a pulled GGUF's frame)
    are set after it where absent, still under the lock, as `slm import base` sets them."""
    with store.locked():
        for kind, name, digest in names_of(comp):
            existing = store.names.get(kind, name)
            if existing not in (None, digest):
                raise InvalidInput(f"a different {kind[:-1]} is already named {name!r} in this store; "
                                   "rename it before receiving this composition")
            try:
                naming.claim(store, kind, name)
            except InvalidInput as err:
                raise InvalidInput(f"the composition received names its {kind[:-1]} {name!r}: {err}") from None
        hex_id = dg.hex_of(comp.id)
        had_record = store.names.get("compositions", hex_id)
        new_dirs = [store.names.root / k for k in ("bases", "adapters", "compositions")
                    if not (store.names.root / k).is_dir()]  # names.set creates them: undo removes them
        with store.transaction(intent_name(KIND, hex_id), OP, record, created=had_record is None,
                               done=f"composition {dg.short(comp.id)} is received") as tx:
            new: list[str] = []
            named: list[tuple[str, str]] = []
            tx.on_undo(lambda: store.objects.remove_new(new))
            tx.on_undo(lambda: _remove_empty(new_dirs))
            tx.on_undo(lambda: _unname(store, named))
            fs.point("bundle.before-commit")
            new.extend(staging.commit())
            for kind, name, digest in names_of(comp):
                if store.names.get(kind, name) is None:
                    naming.log_line(store, tx, kind, name, None, digest, OP)  # a name's history begins
                    named.append((kind, name))  # before: a set whose directory fsync fails renamed already
                    store.names.set(kind, name, digest)
            fs.point("bundle.before-record")
            tx.commit(lambda: store.names.set("compositions", hex_id, record),  # the commit point
                      landed=lambda: store.names.get("compositions", hex_id) == record)
        for kind, name, digest in side_names:
            store.names.set_once(kind, name, digest)
    return new


def _unname(store: StoreDir, named: list[tuple[str, str]]) -> None:
    for kind, name in named:
        store.names.remove(kind, name)


def _remove_empty(folders) -> None:
    for folder in folders:
        if folder.is_dir() and not any(folder.iterdir()):
            fs.remove_any(folder)


def recover(store: StoreDir, intent: Intent, seen: Seen) -> Recovery:
    """An interrupted receive is finished if every blob its record (the intent's new id) names
    is stored intact: the names still free are set, then the record. Otherwise it is undone by
    clearing the intent (`slm gc` removes what it stored)."""
    record, what = intent.new, "a composition"
    try:
        comp = parse_composition(store.objects.read_verified(record))
        what = f"composition {dg.short(comp.id)}"
        base = parse_base_manifest(store.objects.read_verified(comp.base))
        adapters = [parse_adapter_manifest(store.objects.read_verified(a.digest)) for a in comp.adapters]
        complete = all(seen.intact(d) for d in expected_blobs(comp, record, base, adapters))
    except SlmError:
        complete = False
    if not complete:
        return Recovery(f"interrupted receive of {what} (not all its blobs stored)",
                        "undo it (`slm gc` removes what it stored)")

    def finish() -> None:
        for kind, name, digest in names_of(comp):
            if store.names.get(kind, name) is None:
                naming.log_missing_line(store, kind, name, None, digest, OP)
                store.names.set(kind, name, digest)
        store.names.set("compositions", dg.hex_of(comp.id), record)
    return Recovery(f"interrupted receive of {what} (all its blobs are stored)",
                    "finish it: set its names and composition record", finish)


def copy_bounded(chunks, out, size: int, digest: str, where: str, progress: Progress) -> tuple[int, str]:
    """Copy a blob's chunks to `out` as they arrive, refused at the first byte past the `size`
    its descriptor gives (a longer body never lands whole): (bytes copied, "sha256:<hex>")."""
    n, sha = 0, hashlib.sha256()
    for chunk in chunks:
        n += len(chunk)
        if n > size:
            raise IntegrityError(f"{where}: blob {digest[:19]} is longer than the {size} bytes its descriptor says")
        sha.update(chunk)
        out.write(chunk)
        progress.advance(len(chunk))
    return n, SHA256 + sha.hexdigest()
