"""Signed verify certificates (slm.distribution.signing, schema slm.certificate/1): written by
`slm verify --certificate FILE --key KEY`, recorded with the composition, checked by `slm health`.

A certificate that certifies passing numerics (so records golden answers) of a stored
composition is also recorded with it, as a signature is (slm.ops.ship.signing.list_blob: the
record lists the blob under `certificates`, the rename of names/compositions/<id> is the commit
point): so it travels wherever the composition does (bundles, `slm push` as a referrer of its
manifest, `slm pull`), and `slm health` checks it without being given the file. A certificate
is never listed as a signature: require_signed does not count it, `slm verify --signature`
does not show it. Only a certificate whose signature verifies and which names the composition
is recorded, whoever signed it; which keys are believed is asked when it is checked
(config.toml trusted_keys, at `slm health`).
"""

from __future__ import annotations

from pathlib import Path

from slm.ops.results import Certified
from slm.ops.store import specs
from slm.store import StoreDir, outputs
from slm.store import digest as dg


def write_certificate(comp_id: str, result: dict, key_path: Path, target: outputs.OutputFile) -> bytes:
    """Sign a verify result, bound to its composition id, into `target` (a new file on the
    guarded output path, slm.store.outputs) and commit it; returns the certificate's bytes."""
    from slm.distribution import signing  # Ed25519 and the canonical JSON load when a certificate is touched

    key = signing.load_private_key(Path(key_path))
    data = signing.certificate(comp_id, result, key)
    target.write(data)
    target.commit()
    return data


def _checked(data: bytes, what: str, keys, comp_id: str | None = None) -> dict:
    """A certificate's signature checked (and, given `comp_id`, that it names that composition)."""
    from slm.distribution import signing

    if comp_id is None:
        comp_id, key, result = signing.check_certificate(data, what)
    else:
        key, result = signing.check_certificate_of(data, comp_id, what)
    return {"composition_id": comp_id, "public_key": key, "fingerprint": signing.key_fingerprint(key),
            "trusted": key in set(keys), "result": result}


def check_certificate(path: Path, keys=()) -> dict:
    """A certificate file, its signature checked: {composition_id, public_key, fingerprint,
    trusted (its key is one of `keys`), result}."""
    from slm.distribution import signing
    from slm.formats.untrusted import read_untrusted

    return _checked(read_untrusted(Path(path), signing.MAX_CERT_BYTES, "certificate"), Path(path).name, keys)


def recorded(store: StoreDir, comp_id: str) -> list[tuple[str, bytes]]:
    """(digest, bytes) of each certificate the store records with composition `comp_id`, in the
    order they were recorded (none if the composition is not stored); each blob re-hashed as it
    is read, not yet checked."""
    if store.names.get("compositions", dg.hex_of(comp_id)) is None:
        return []
    from slm.ops.infer import compositions

    return [(d, store.objects.read_verified(d)) for d in compositions.load(store, comp_id).certificates]


def check_recorded(store: StoreDir, comp_id: str, keys=()) -> list[dict]:
    """Each recorded certificate of `comp_id`, checked as check_certificate checks a file, with
    its digest: one that does not verify, or names another composition, raises."""
    return [{**_checked(data, f"recorded certificate {dg.short(digest)}", keys, comp_id), "digest": digest}
            for digest, data in recorded(store, comp_id)]


def record(store: StoreDir, comp_id: str, blob: bytes) -> tuple[str, bool]:
    """List a certificate with stored composition `comp_id` once its signature verifies and it
    names that composition (IntegrityError / InvalidInput otherwise, nothing written):
    (its digest, whether it was new). The caller holds the store lock."""
    from slm.distribution import signing
    from slm.ops.ship.signing import list_blob

    signing.check_certificate_of(blob, comp_id)
    return dg.of_bytes(blob), list_blob(store, comp_id, blob, "certificates")[1]


def adopt(store: StoreDir, comp_id: str, blobs: list[bytes]) -> int:
    """Record each certificate with a received composition; returns how many were new."""
    with store.locked():
        return sum(record(store, comp_id, blob)[1] for blob in blobs)


def _unrecorded(store: StoreDir, report) -> str:
    """Why a certificate is not recorded with its composition ("" when it is to be)."""
    if report.numerics is None:
        return "it certifies no numerics (--no-numerics), so no golden answers"
    if not report.ok:
        return "the verification failed"
    if store.names.get("compositions", dg.hex_of(report.composition)) is None:
        return "the composition is not stored (activate or tag it, then verify again)"
    return ""


def certify(store: StoreDir, ref: str | None, key_path: Path, out: Path, numerics: bool = True,
            progress=None) -> Certified:
    """`slm verify --certificate OUT --key KEY`: verify, then write the report signed and bound to
    the composition id (written whatever the result: the result says whether it passed); with
    numerics checked and passed, it also records the golden answers (slm.ops.infer.golden) that
    `slm health` compares, and records the certificate with the stored composition."""
    from slm.distribution import signing
    from slm.ops.infer import golden, verify
    from slm.ops.infer.loading import load_composition

    signing.load_private_key(Path(key_path))  # a bad key fails before minutes of verification
    # ... and so does a bad output (inside the store, already there, unwritable)
    with outputs.OutputFile(Path(out), store.root, "--certificate") as target:
        report = verify.verify(store, ref, numerics, progress)
        result = report.to_json()
        if report.numerics is not None and report.ok:
            comp = specs.resolve(store, ref)  # (a spec composed, never stored, has no id to resolve by)
            result["golden"] = golden.answers(store, load_composition(store, comp, verify=False))
        data = write_certificate(report.composition, result, Path(key_path), target)
    why_not = _unrecorded(store, report)
    digest = None
    if not why_not:
        with store.locked():
            digest, _ = record(store, report.composition, data)
    return Certified(report, str(target.shown), digest, why_not)
