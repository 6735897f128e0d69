"""Signatures and certificates as OCI referrers on `slm pull`: `slm push` sends each signature
and each signed verify certificate as a referrer of the composition's manifest
(slm.ops.ship.registry_ops), each kind under its own artifactType; a pull fetches the referrers
of the manifest it pulls (the registry's referrers API, else the OCI 1.1 fallback tag
`sha256-<hex of the manifest>`), checks each one for the composition the manifest's config
names before anything is received (one that is malformed, larger than its kind's bound, or
does not verify for that composition refuses the pull: exit 4 or 5, the store unchanged), and
once the composition is received lists those it did not already carry with it.

A referrer of another artifactType (a cosign signature, an SBOM) is not slm's and is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from slm.compose.composition import MAX_CERTIFICATES, MAX_SIGNATURES
from slm.distribution import mediatypes as mt
from slm.distribution.bundle import (MAX_CERT_BYTES, MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES, MAX_SIGNATURE_BYTES,
                                     Manifest, parse_config, parse_descriptor, sha256_of)
from slm.distribution.registry import Registry
from slm.errors import IntegrityError, InvalidInput
from slm.formats.jsonfile import parse_json_object
from slm.store import StoreDir

MAX_REFERRERS = 256


@dataclass(frozen=True)
class Kind:
    """One kind of slm referrer: its artifactType, its one layer's media type and bound, and how
    many a composition record lists at most (more referrers of the kind are refused unread)."""

    name: str  # as messages say it
    artifact_type: str
    media_type: str
    max_bytes: int
    max_count: int


SIGNATURE = Kind("signature", mt.ARTIFACT_SIGNATURE, mt.SIGNATURE, MAX_SIGNATURE_BYTES, MAX_SIGNATURES)
CERTIFICATE = Kind("certificate", mt.ARTIFACT_CERTIFICATE, mt.CERTIFICATE, MAX_CERT_BYTES, MAX_CERTIFICATES)
KINDS = (SIGNATURE, CERTIFICATE)
KIND_OF_LAYER = {k.media_type: k for k in KINDS}


def _index_entries(registry: Registry, subject: str, kinds: tuple[Kind, ...]) -> list[tuple[Kind, str]]:
    """(kind, digest) of the slm referrers of `subject` of the kinds asked for."""
    data = registry.get_referrers(subject)
    if data is None:  # no referrers API: the fallback tag, if anyone maintained one
        try:
            data = registry.get_manifest(subject.replace(":", "-"), mt.OCI_INDEX)
        except InvalidInput:  # something else under that tag (not an index): no referrers list
            return []
    if data is None:
        return []
    index = parse_json_object(data, f"referrers index of {subject[:19]}", MAX_MANIFEST_BYTES)
    entries = index.get("manifests")
    if not isinstance(entries, list) or len(entries) > MAX_REFERRERS:
        raise InvalidInput(f"the referrers index of {subject[:19]} is not a list of at most {MAX_REFERRERS} manifests")
    by_type = {k.artifact_type: k for k in kinds}
    out = []
    for i, entry in enumerate(entries):
        kind = by_type.get(entry.get("artifactType")) if isinstance(entry, dict) else None
        if kind is not None:
            desc, _ = parse_descriptor({k: v for k, v in entry.items() if k != "artifactType"},
                                       f"referrers index of {subject[:19]} [{i}]")
            out.append((kind, desc.digest))
    for kind in kinds:
        if sum(1 for k, _ in out if k is kind) > kind.max_count:
            raise InvalidInput(f"the referrers index of {subject[:19]} lists more than {kind.max_count} "
                               f"{kind.name}s, more than a composition record holds")
    return out


def _blob_of(registry: Registry, kind: Kind, digest: str, subject: str) -> bytes:
    """The one layer of a referrer of `kind`, its size bounded before it is read."""
    what = f"{kind.name} referrer {digest[:19]}"
    doc = parse_json_object(registry.get_manifest(digest) or b"null", what, MAX_MANIFEST_BYTES)
    layers = doc.get("layers")
    if (doc.get("artifactType") != kind.artifact_type or not isinstance(doc.get("subject"), dict)
            or doc["subject"].get("digest") != subject or not isinstance(layers, list) or len(layers) != 1):
        raise InvalidInput(f"{what}: not one slm {kind.name} referring to {subject[:19]}")
    layer, _ = parse_descriptor(layers[0], what + " layer", {mt.BLAKE3_ANNOTATION, mt.TITLE_ANNOTATION})
    if layer.media_type != kind.media_type or layer.size > kind.max_bytes:
        raise InvalidInput(f"{what}: its layer is not a {kind.name} of at most {kind.max_bytes} bytes")
    blob = registry.get_blob(layer.digest, layer.size)
    if len(blob) != layer.size or sha256_of(blob) != layer.digest:
        raise IntegrityError(f"{what}: its {kind.name} blob does not match its descriptor")
    return blob


@dataclass(frozen=True)
class Referred:
    """The checked blobs the registry holds as referrers of a manifest, by kind."""

    signatures: tuple[bytes, ...] = ()
    certificates: tuple[bytes, ...] = ()


def fetch_referrers(registry: Registry, manifest: Manifest, manifest_digest: str,
                    kinds: tuple[Kind, ...] = KINDS, checked: bool = True) -> Referred:
    """The signature and certificate blobs (of `kinds`) the registry holds as referrers of the
    manifest, each checked to be a valid signature, or a certificate whose signature verifies,
    of the composition its config names (IntegrityError / InvalidInput). `checked=False`: each
    blob only bounded and matching its descriptor, for a caller that judges them itself."""
    from slm.distribution import signing

    found = _index_entries(registry, manifest_digest, kinds)
    if not found:
        return Referred()
    comp_id = composition_of(registry, manifest, manifest_digest) if checked else None
    blobs: dict[Kind, list[bytes]] = {k: [] for k in KINDS}
    for kind, digest in found:
        blob = _blob_of(registry, kind, digest, manifest_digest)
        what = f"{kind.name} referrer {digest[:19]}"
        if checked:
            check = signing.parse_signature if kind is SIGNATURE else signing.check_certificate_of
            check(blob, comp_id, what)
        blobs[kind].append(blob)
    return Referred(tuple(blobs[SIGNATURE]), tuple(blobs[CERTIFICATE]))


def fetch_signatures(registry: Registry, manifest: Manifest, manifest_digest: str) -> list[bytes]:
    """The signature referrers of a manifest alone, checked as fetch_referrers checks them."""
    return list(fetch_referrers(registry, manifest, manifest_digest, (SIGNATURE,)).signatures)


def composition_of(registry: Registry, manifest: Manifest, manifest_digest: str) -> str:
    """The composition id a manifest's config names (the config fetched, bounded and checked
    against its descriptor: IntegrityError)."""
    if manifest.config.size > MAX_CONFIG_BYTES:
        raise IntegrityError(f"the config of {manifest_digest[:19]} is larger than {MAX_CONFIG_BYTES} bytes")
    config = registry.get_blob(manifest.config.digest, manifest.config.size)
    if len(config) > MAX_CONFIG_BYTES or sha256_of(config) != manifest.config.digest:
        raise IntegrityError(f"the config of {manifest_digest[:19]} does not match its descriptor")
    return parse_config(config).composition_id


def adopt(store: StoreDir, comp_id: str, blobs: list[bytes]) -> int:
    """List each checked signature blob with the received composition; returns how many were new."""
    from slm.distribution import signing
    from slm.ops.ship.signing import add_signature

    added = 0
    with store.locked():
        for blob in blobs:
            public = signing.parse_signature(blob, comp_id).public_key
            added += add_signature(store, comp_id, blob, public).added
    return added
