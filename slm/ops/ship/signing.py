"""`slm sign`, `slm verify --signature`, signed certificates; the store's signing policy and
its check are in slm.ops.ship.policy (every switch loads that, not this module).

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

from pathlib import Path

from slm.compose.composition import Composition
from slm.errors import NotFound, SlmError
from slm.ops.infer import compositions
from slm.ops.store import specs
from slm.ops.ship.policy import Policy, enforce, policy  # noqa: F401  (the policy lives in slm.ops.ship.policy: a switch loads that alone)
from slm.ops.results import Certified, SignResult, SignatureCheck, SignatureReport
from slm.store import StoreDir, fs, outputs
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

    record = compositions.load(store, comp_id)
    digest = dg.of_bytes(blob)
    added = digest not in record.signatures
    if added:
        updated = record.with_signatures((*record.signatures, digest))
        staging = store.objects.staging()
        hex_id = dg.hex_of(comp_id)
        try:
            staging.put(blob)
            record_digest = staging.put(updated.to_toml())
            new = staging.commit()
            # not journaled: a crash before the commit point leaves only blobs for `slm gc`
            with store.transaction("sign", "sign", record_digest, journaled=False,
                                   done=f"composition {dg.short(comp_id)} is signed") as tx:
                tx.on_undo(lambda: store.objects.remove_new(new))
                fs.point("sign.before-record")
                tx.commit(lambda: store.names.set("compositions", hex_id, record_digest),  # the commit point
                          landed=lambda: store.names.get("compositions", hex_id) == record_digest)
        finally:
            staging.discard()
        record = updated
    return SignResult(comp_id, digest, public, signing.key_fingerprint(public), len(record.signatures), added)


def verify_signatures(store: StoreDir, ref: str | None, keys: list[str] = ()) -> SignatureReport:
    """The signatures of a composition, each checked; trusted = config.toml trusted_keys plus
    the keys given (key texts or PEM files)."""
    from slm.distribution import signing  # Ed25519 and the canonical JSON load when a signature is touched

    comp_id = find(store, ref)
    trusted = policy(store).trusted_keys + tuple(signing.public_key_from_file_or_text(k) for k in keys)
    return SignatureReport(comp_id, tuple(check_signatures(store, comp_id, trusted)), len(set(trusted)))


def write_certificate(comp_id: str, result: dict, key_path: Path, target: outputs.OutputFile) -> str:
    """Sign a verify result, bound to its composition id, into `target` (a new file on the
    guarded output path, slm.store.outputs) and commit it."""
    from slm.distribution import signing  # Ed25519 and the canonical JSON load when a signature is touched

    key = signing.load_private_key(Path(key_path))
    target.write(signing.certificate(comp_id, result, key))
    target.commit()
    return str(target.shown)


def check_certificate(path: Path, keys: list[str] = ()) -> dict:
    from slm.distribution import signing  # Ed25519 and the canonical JSON load when a signature is touched

    from slm.formats.untrusted import read_untrusted

    data = read_untrusted(Path(path), signing.MAX_CERT_BYTES, "certificate")
    comp_id, key, result = signing.check_certificate(data, Path(path).name)
    trusted = set(keys)
    return {"composition_id": comp_id, "public_key": key, "fingerprint": signing.key_fingerprint(key),
            "trusted": key in trusted, "result": result}


def certify(store: StoreDir, ref: str | None, key_path: Path, out: Path, numerics: bool = True,
            progress=None) -> Certified:
    """`slm verify --certificate OUT --key KEY`: verify, then write the report signed and bound to
    the composition id (written whatever the result: the result says whether it passed); with
    numerics checked and passed, it also records the golden answers (slm.ops.infer.golden) that
    `slm health` compares."""
    from slm.distribution import signing
    from slm.ops.infer import golden, verify
    from slm.ops.infer.loading import load_composition

    signing.load_private_key(Path(key_path))  # a bad key fails before minutes of verification
    # ... and so does a bad output (inside the store, already there, unwritable)
    with outputs.OutputFile(Path(out), store.root, "--certificate") as target:
        report = verify.verify(store, ref, numerics, progress)
        result = report.to_json()
        if report.numerics is not None and report.ok:
            comp = specs.resolve(store, report.composition)
            result["golden"] = golden.answers(store, load_composition(store, comp, verify=False))
        path = write_certificate(report.composition, result, Path(key_path), target)
    return Certified(report, path)
