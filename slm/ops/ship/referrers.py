"""Signatures as OCI referrers on `slm pull`: `slm push` sends each signature as a referrer of
the composition's manifest (slm.ops.ship.registry_ops); a pull fetches the signature referrers of the
manifest it pulls (the registry's referrers API, else the OCI 1.1 fallback tag
`sha256-<hex of the manifest>`), checks each one for the composition the manifest's config names
before anything is received (one that does not verify refuses the pull: exit 5, the store
unchanged), and once the composition is received lists those it did not already carry with it.

A referrer of another artifactType (a cosign signature, an SBOM) is not slm's and is left alone.
"""

from __future__ import annotations

from slm.distribution import mediatypes as mt
from slm.distribution.bundle import (MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES, MAX_SIGNATURE_BYTES, Manifest,
                                     parse_config, parse_descriptor, sha256_of)
from slm.distribution.registry import Registry
from slm.errors import IntegrityError, InvalidInput
from slm.formats.jsonfile import parse_json_object
from slm.store import StoreDir

MAX_REFERRERS = 256


def _index_entries(registry: Registry, subject: str) -> list[str]:
    """The digests of the slm signature referrers of `subject`."""
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
    out = []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict) and entry.get("artifactType") == mt.ARTIFACT_SIGNATURE:
            desc, _ = parse_descriptor({k: v for k, v in entry.items() if k != "artifactType"},
                                       f"referrers index of {subject[:19]} [{i}]")
            out.append(desc.digest)
    return out


def _signature_of(registry: Registry, digest: str, subject: str) -> bytes:
    what = f"signature referrer {digest[:19]}"
    doc = parse_json_object(registry.get_manifest(digest) or b"null", what, MAX_MANIFEST_BYTES)
    layers = doc.get("layers")
    if (doc.get("artifactType") != mt.ARTIFACT_SIGNATURE or not isinstance(doc.get("subject"), dict)
            or doc["subject"].get("digest") != subject or not isinstance(layers, list) or len(layers) != 1):
        raise InvalidInput(f"{what}: not one slm signature referring to {subject[:19]}")
    layer, _ = parse_descriptor(layers[0], what + " layer", {mt.BLAKE3_ANNOTATION, mt.TITLE_ANNOTATION})
    if layer.media_type != mt.SIGNATURE or layer.size > MAX_SIGNATURE_BYTES:
        raise InvalidInput(f"{what}: its layer is not a signature of at most {MAX_SIGNATURE_BYTES} bytes")
    blob = registry.get_blob(layer.digest, layer.size)
    if len(blob) != layer.size or sha256_of(blob) != layer.digest:
        raise IntegrityError(f"{what}: its signature blob does not match its descriptor")
    return blob


def fetch_signatures(registry: Registry, manifest: Manifest, manifest_digest: str) -> list[bytes]:
    """The signature blobs the registry holds as referrers of the manifest, each checked to be
    a valid signature of the composition its config names (IntegrityError / InvalidInput)."""
    from slm.distribution import signing

    digests = _index_entries(registry, manifest_digest)
    if not digests:
        return []
    comp_id = composition_of(registry, manifest, manifest_digest)
    blobs = []
    for digest in digests:
        blob = _signature_of(registry, digest, manifest_digest)
        signing.parse_signature(blob, comp_id, f"signature referrer {digest[:19]}")
        blobs.append(blob)
    return blobs


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
