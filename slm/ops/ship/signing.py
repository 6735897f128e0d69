"""`slm sign`, `slm verify --signature`; the store's signing policy and its check are in
slm.ops.ship.policy (every switch loads that, not this module); signed verify certificates,
listed in the record the same way (list_blob), in slm.ops.ship.certificates.

Policy, in the store's config.toml (top level):

    require_signed = true
    trusted_keys = ["ed25519:<base64>", ...]

With require_signed, every activation (activate, deactivate, rollback, upgrade: each is a
switch) refuses a composition that carries no signature that verifies under a trusted key,
with one line and before anything is written.

Signing stores the signature blob and replaces the composition record with one that lists it
(same identity, so the same id): the rename of names/compositions/<id> is the commit point; a
crash before it leaves only unreferenced blobs for `slm gc`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from slm.compose.composition import MAX_CERTIFICATES, MAX_SIGNATURES, Composition
from slm.errors import Incompatible, NotFound, SlmError
from slm.ops.infer import compositions
from slm.ops.store import specs
from slm.ops.ship.policy import Policy, enforce, policy  # noqa: F401  (the policy lives in slm.ops.ship.policy: a switch loads that alone)
from slm.ops.results import SignResult, SignatureCheck, SignatureReport
from slm.store import StoreDir, fs
from slm.store import digest as dg


def _record(store: StoreDir, comp_id: str) -> Composition | None:
    """The stored record of a composition (where its signatures are listed), if any."""
    if store.names.get("compositions", dg.hex_of(comp_id)) is None:
        return None
    return compositions.load(store, comp_id)


def check_signatures(store: StoreDir, comp_id: str, trusted: tuple[str, ...]) -> list[SignatureCheck]:
    """Each signature the store lists with the composition, checked (none if it is not stored)."""
    record = _record(store, comp_id)
    return [check_signature(digest, lambda d=digest: store.objects.read_verified(d), comp_id, trusted)
            for digest in (record.signatures if record else ())]


def check_signature(digest: str, read, comp_id: str, trusted: tuple[str, ...]) -> SignatureCheck:
    """One signature blob (`read()` gives its bytes) checked for `comp_id` under `trusted`: a
    blob that cannot be read or does not verify is an invalid check, not an error."""
    from slm.distribution import signing  # Ed25519 and the canonical JSON load when a signature is touched

    try:
        sig = signing.parse_signature(read(), comp_id, f"signature {dg.short(digest)}")
    except SlmError as err:
        return SignatureCheck(digest, None, None, False, False, str(err))
    return SignatureCheck(digest, sig.public_key, sig.fingerprint, True, sig.public_key in trusted)


def find(store: StoreDir, ref: str | None) -> str:
    if ref is None:
        return compositions.active_id(store, "name a composition to sign")
    comp_id = specs.resolve(store, ref).id
    if store.names.get("compositions", dg.hex_of(comp_id)) is None:
        raise NotFound(f"composition {dg.short(comp_id)} is not stored: activate or tag it first "
                       "(a signature is kept with the stored record)")
    return comp_id


def sign(store: StoreDir, ref: str | None, key_path: Path) -> SignResult:
    from slm.distribution import signing  # Ed25519 and the canonical JSON load when a signature is touched

    key = signing.load_private_key(Path(key_path))
    public = signing.public_key_text(key)
    with store.locked():
        comp_id = find(store, ref)
        return add_signature(store, comp_id, signing.sign(comp_id, key), public)


def add_signature(store: StoreDir, comp_id: str, blob: bytes, public: str) -> SignResult:
    """Store a signature blob (checked by the caller) and list it in the composition's record;
    the caller holds the store lock."""
    from slm.distribution import signing

    record, added = list_blob(store, comp_id, blob, "signatures")
    return SignResult(comp_id, dg.of_bytes(blob), public, signing.key_fingerprint(public), len(record.signatures),
                      added)


# a record's lists of blobs: (the op that adds to it, how many it holds, what a commit made)
LISTS = {"signatures": ("sign", MAX_SIGNATURES, "is signed"),
         "certificates": ("certify", MAX_CERTIFICATES, "records the certificate")}


def list_blob(store: StoreDir, comp_id: str, blob: bytes, kind: str) -> tuple[Composition, bool]:
    """Store a blob (checked by the caller) and list it in the composition record's `kind`
    ("signatures" or "certificates"): (the record, whether it was new). The caller holds the
    store lock."""
    op, limit, made = LISTS[kind]
    record = compositions.load(store, comp_id)
    digest = dg.of_bytes(blob)
    listed = getattr(record, kind)
    if digest in listed:
        return record, False
    if len(listed) >= limit:
        raise Incompatible(f"composition {dg.short(comp_id)} already lists {limit} {kind}, as many as a record holds")
    updated = dataclasses.replace(record, **{kind: (*listed, digest)})
    staging = store.objects.staging()
    hex_id = dg.hex_of(comp_id)
    try:
        staging.put(blob)
        record_digest = staging.put(updated.to_toml())
        new = staging.commit()
        # not journaled: a crash before the commit point leaves only blobs for `slm gc`
        with store.transaction(op, op, record_digest, journaled=False,
                               done=f"composition {dg.short(comp_id)} {made}") as tx:
            tx.on_undo(lambda: store.objects.remove_new(new))
            fs.point(f"{op}.before-record")
            tx.commit(lambda: store.names.set("compositions", hex_id, record_digest),  # the commit point
                      landed=lambda: store.names.get("compositions", hex_id) == record_digest)
    finally:
        staging.discard()
    return updated, True


def verify_signatures(store: StoreDir, ref: str | None, keys: list[str] = ()) -> SignatureReport:
    """The signatures of a composition, each checked; trusted = config.toml trusted_keys plus
    the keys given (key texts or PEM files)."""
    from slm.distribution import signing  # Ed25519 and the canonical JSON load when a signature is touched

    comp_id = find(store, ref)
    trusted = policy(store).trusted_keys + tuple(signing.public_key_from_file_or_text(k) for k in keys)
    return SignatureReport(comp_id, tuple(check_signatures(store, comp_id, trusted)), len(set(trusted)))
