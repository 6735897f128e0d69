"""The OCI image manifest and config blob of an slm bundle: built from the store, parsed strictly.

    manifest  {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_COMPOSITION,
               "config": <config descriptor>, "layers": [<layer descriptor>, ...]}
    layer     {"mediaType": ..., "digest": "sha256:<hex>", "size": N,
               "annotations": {"org.slm.blake3": "blake3:<hex>",
                               "org.opencontainers.image.title": <file name, slm.distribution.titles>}}
    config    {"schema": "slm.bundle/1", "composition_id": .., "composition_manifest": ..,
               "identity": {<the composition's identity fields>}}

Layers, in order: the composition record, the base manifest, the tokenizer, the base tensors (in
the base manifest's order), then per adapter its manifest and tensors, then signatures, then
signed verify certificates; a blob named twice is listed once. JSON is written with sorted keys
and no whitespace, so one composition always gives one manifest digest (a second push finds
everything in place).

Parsing refuses any field it does not know: a bundle is checked, not interpreted generously.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from slm.compose.adapter_manifest import parse_adapter_manifest
from slm.compose.base_manifest import parse_base_manifest
from slm.compose.composition import Composition
from slm.compose.toml_io import MAX_MANIFEST as MAX_TOML_MANIFEST
from slm.distribution import mediatypes as mt
from slm.distribution import titles
from slm.errors import InvalidInput
from slm.formats.jsonfile import parse_json_object
from slm.store import digest as dg
from slm.store.objects import ObjectStore

SCHEMA = "slm.bundle/1"
SHA256 = "sha256:"
_SHA_HEX = re.compile(r"[0-9a-f]{64}")
MAX_MANIFEST_BYTES = 4 << 20  # an OCI manifest of a few thousand layers is well under this
MAX_CONFIG_BYTES = 1 << 20  # a composition id, a record digest and the identity of <= 64 adapters
MAX_SIGNATURE_BYTES = 1 << 20  # an OMS signature lists every file of the bundle it signs
MAX_CERT_BYTES = 1 << 20  # a verify report with its golden answers
MAX_LAYERS = 20000
# One tensor blob: the embedding table of the largest open models in float32 is under this.
# Such blobs are streamed into the store, never held whole; the bound refuses absurd claims.
MAX_BLOB_BYTES = 64 << 30
# The layers a receiver parses, so holds whole: each refused above its bound before it is read.
SMALL_LAYER_LIMITS = {mt.COMPOSITION: MAX_TOML_MANIFEST, mt.BASE_MANIFEST: MAX_TOML_MANIFEST,
                      mt.ADAPTER_MANIFEST: MAX_TOML_MANIFEST, mt.SIGNATURE: MAX_SIGNATURE_BYTES,
                      mt.CERTIFICATE: MAX_CERT_BYTES}


def sha256_of(data: bytes | memoryview) -> str:
    return SHA256 + hashlib.sha256(data).hexdigest()


def is_sha256(text: object) -> bool:
    return isinstance(text, str) and text.startswith(SHA256) and _SHA_HEX.fullmatch(text[7:]) is not None


def canonical(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


@dataclass(frozen=True)
class Layer:
    media_type: str
    blake3: str
    sha256: str
    size: int
    title: str = ""  # the file name OCI clients give it (annotation only: no digest depends on it)

    def descriptor(self) -> dict:
        notes = {mt.BLAKE3_ANNOTATION: self.blake3}
        if self.title:
            notes[mt.TITLE_ANNOTATION] = self.title
        return {"mediaType": self.media_type, "digest": self.sha256, "size": self.size, "annotations": notes}


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str  # sha256:<hex>
    size: int

    def to_json(self) -> dict:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class Manifest:
    config: Descriptor
    layers: tuple[Layer, ...]
    artifact_type: str = mt.ARTIFACT_COMPOSITION
    subject: Descriptor | None = None

    def to_bytes(self) -> bytes:
        doc = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST, "artifactType": self.artifact_type,
               "config": self.config.to_json(), "layers": [l.descriptor() for l in self.layers]}
        if self.subject is not None:
            doc["subject"] = self.subject.to_json()
        return canonical(doc)


def config_bytes(comp: Composition, record_digest: str) -> bytes:
    return canonical({"schema": SCHEMA, "composition_id": comp.id, "composition_manifest": record_digest,
                      "identity": comp.identity()})


def blobs_of(objects: ObjectStore, comp: Composition, record_digest: str) -> list[tuple[str, str, str]]:
    """(blake3 digest, media type, title) of every blob a bundle of `comp` holds, in layer order
    (its signatures and certificates: those its record lists)."""
    out = [(record_digest, mt.COMPOSITION, "composition.toml"), (comp.base, mt.BASE_MANIFEST, "base.toml")]
    base = parse_base_manifest(objects.read_verified(comp.base))
    out.append((base.tokenizer_digest, mt.TOKENIZER, "tokenizer.json"))
    out += [(t.digest, mt.TENSOR, f"base.{t.name}") for t in base.tensors]
    for i, a in enumerate(comp.adapters):
        prefix = titles.adapter_prefix(i, a.name)
        out.append((a.digest, mt.ADAPTER_MANIFEST, f"{prefix}.toml"))
        for target in parse_adapter_manifest(objects.read_verified(a.digest)).targets:
            out += [(t.digest, mt.TENSOR, f"{prefix}.{target.module}.{key}") for key, t in target.tensors.items()]
    out += [(s, mt.SIGNATURE, f"signature-{i}.json") for i, s in enumerate(comp.signatures)]
    out += [(c, mt.CERTIFICATE, f"certificate-{i}.json") for i, c in enumerate(comp.certificates)]
    seen: set[str] = set()
    once = []
    for entry in out:
        if entry[0] not in seen:
            seen.add(entry[0])
            once.append(entry)
    return titles.unique(once)


# -- parsing ----------------------------------------------------------------------------------

def _json_object(data: bytes, what: str) -> dict:
    return parse_json_object(data, what, MAX_MANIFEST_BYTES)


def _only(doc: dict, allowed: set[str], what: str) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise InvalidInput(f"{what}: unknown field {unknown[0]!r}")


def byte_count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{what}: size {value!r} is not a byte count")
    _bounded(value, MAX_BLOB_BYTES, what)
    return value


def _bounded(size: int, limit: int, what: str) -> None:
    """Refuse a descriptor claiming more bytes than a blob of its kind can hold: before reading."""
    if size > limit:
        raise InvalidInput(f"{what}: {size} bytes claimed, more than a blob of its kind can be ({limit})")


def parse_descriptor(doc: object, what: str, annotations: set[str] = frozenset()) -> tuple[Descriptor, dict]:
    if not isinstance(doc, dict):
        raise InvalidInput(f"{what}: not a descriptor object")
    _only(doc, {"mediaType", "digest", "size", "annotations", "artifactType"}, what)
    media, digest = doc.get("mediaType"), doc.get("digest")
    if not isinstance(media, str):
        raise InvalidInput(f"{what}: mediaType missing")
    if not is_sha256(digest):
        raise InvalidInput(f"{what}: digest {digest!r} is not sha256:<64 hex> (slm bundles use sha256 on the wire)")
    notes = doc.get("annotations", {})
    if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
        raise InvalidInput(f"{what}: annotations must map strings to strings")
    _only(notes, set(annotations), f"{what} annotations")
    return Descriptor(media, digest, byte_count(doc.get("size"), what)), notes


def parse_manifest(data: bytes, what: str = "bundle manifest") -> Manifest:
    doc = _json_object(data, what)
    _only(doc, {"schemaVersion", "mediaType", "artifactType", "config", "layers", "subject", "annotations"}, what)
    if doc.get("schemaVersion") != 2 or doc.get("mediaType") != mt.OCI_MANIFEST:
        raise InvalidInput(f"{what}: not an OCI image manifest (schemaVersion 2, mediaType {mt.OCI_MANIFEST})")
    artifact = doc.get("artifactType")
    if artifact != mt.ARTIFACT_COMPOSITION:
        raise InvalidInput(f"{what}: artifactType {artifact!r} is not an slm composition "
                           f"({mt.ARTIFACT_COMPOSITION})")
    if doc.get("annotations", {}) != {} or "subject" in doc:
        raise InvalidInput(f"{what}: a composition manifest carries no annotations or subject")
    config, _ = parse_descriptor(doc.get("config"), f"{what} config")
    if config.media_type != mt.CONFIG:
        raise InvalidInput(f"{what}: config mediaType {config.media_type!r}, expected {mt.CONFIG}")
    _bounded(config.size, MAX_CONFIG_BYTES, f"{what} config")
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, list) or not raw_layers or len(raw_layers) > MAX_LAYERS:
        raise InvalidInput(f"{what}: layers must be a list of 1 to {MAX_LAYERS} descriptors")
    layers = []
    for i, raw in enumerate(raw_layers):
        where = f"{what} layer {i}"
        desc, notes = parse_descriptor(raw, where, {mt.BLAKE3_ANNOTATION, mt.TITLE_ANNOTATION})
        if desc.media_type not in mt.LAYER_TYPES:
            raise InvalidInput(f"{where}: unknown mediaType {desc.media_type!r}")
        _bounded(desc.size, SMALL_LAYER_LIMITS.get(desc.media_type, MAX_BLOB_BYTES), f"{where} ({desc.media_type})")
        blake = notes.get(mt.BLAKE3_ANNOTATION)
        if not isinstance(blake, str) or not dg.is_digest(blake):
            raise InvalidInput(f"{where}: annotation {mt.BLAKE3_ANNOTATION} is missing or not a blake3 digest")
        title = notes.get(mt.TITLE_ANNOTATION, "")
        if title != titles.safe(title) and title:
            raise InvalidInput(f"{where}: title {title[:40]!r} is not a plain file name")
        layers.append(Layer(desc.media_type, blake, desc.digest, desc.size, title))
    if len({l.blake3 for l in layers}) != len(layers):
        raise InvalidInput(f"{what}: a blob is listed twice")
    return Manifest(config, tuple(layers))


@dataclass(frozen=True)
class BundleConfig:
    composition_id: str
    composition_manifest: str
    identity: dict


def parse_config(data: bytes, what: str = "bundle config") -> BundleConfig:
    doc = _json_object(data, what)
    _only(doc, {"schema", "composition_id", "composition_manifest", "identity"}, what)
    if doc.get("schema") != SCHEMA:
        raise InvalidInput(f"{what}: schema {doc.get('schema')!r}, expected {SCHEMA!r}")
    comp_id, record = doc.get("composition_id"), doc.get("composition_manifest")
    if not (isinstance(comp_id, str) and dg.is_digest(comp_id) and isinstance(record, str) and dg.is_digest(record)):
        raise InvalidInput(f"{what}: composition_id and composition_manifest must be blake3 digests")
    identity = doc.get("identity")
    if not isinstance(identity, dict):
        raise InvalidInput(f"{what}: identity missing")
    return BundleConfig(comp_id, record, identity)
