"""`slm sign --format oms`: OpenSSF Model Signing v1 signatures (slm.distribution.oms).

    slm sign --format oms --key KEY.pem --out SIG DIR
        sign every file of DIR (an `slm export -o DIR` bundle, a PEFT export, any directory)
        with an ECDSA key; SIG verifies with `model_signing verify key`. The store is unchanged.
    slm sign --format oms --key KEY.pem --certificate CERT.pem [--certificate-chain CA.pem].. --out SIG DIR
        the same in certificate mode (model_signing verify certificate checks it)
    slm sign --format oms --signature SIG [--key PUB.pem | --certificate-chain ROOT.pem..] DIR
        record an OMS signature of an exported bundle directory (made by slm or by
        `model_signing sign key`) with the composition DIR holds: SIG is checked under the key
        (--key, else each ecdsa key of config.toml trusted_keys), DIR's files against it, and
        the composition must be in the store. It then counts for `slm verify --signature` and
        require_signed like an Ed25519 signature of the same key.
    slm sign --format oms --key KEY.pem --out SIG DIR --for REPO:TAG --version N --expires DURATION
        the same signature, its predicate also carrying a statement for the tag about the
        composition DIR's bundle holds (slm.distribution.statement); record it as above.
"""

from __future__ import annotations

import os
from pathlib import Path

from slm.distribution import oms, oms_certs, signing
from slm.distribution.bundle import parse_manifest, sha256_of
from slm.distribution.layout_read import LayoutReader
from slm.errors import IntegrityError, InvalidInput, NotFound, UsageError
from slm.ops.infer import compositions
from slm.ops.ship.policy import policy
from slm.ops.results import OmsSignResult, SignResult, StatementResult
from slm.ops.ship import statements
from slm.ops.ship.signing import add_signature, sign
from slm.store import StoreDir, outputs


def sign_as_asked(store: StoreDir, ref: str | None, key, fmt: str, out, signature, certificate=None,
                  chain=(), target: str | None = None, version: int | None = None,
                  expires: str | None = None) -> SignResult | OmsSignResult | StatementResult:
    """`slm sign`'s forms and the rules of their arguments; `target`, `version` and `expires`
    (all three or none) make it a statement for a tag (slm.ops.ship.statements)."""
    if fmt not in ("slm", "oms"):
        raise InvalidInput(f"--format {fmt!r}: choose one of slm, oms")
    statement = (target, version, expires) != (None, None, None)
    if statement and None in (target, version, expires):
        raise UsageError("--for REPO:TAG, --version N and --expires DURATION go together")
    if statement and fmt == "oms" and out is None:
        raise UsageError("--format oms: --for goes with --out SIG (signing a directory)")
    if fmt == "slm":
        if out is not None or signature is not None or certificate is not None or chain:
            raise UsageError("--out, --signature, --certificate and --certificate-chain go with --format oms")
        if key is None:
            raise UsageError("give --key KEY.pem (an Ed25519 private key)")
        if statement:
            return statements.sign_for(store, ref, Path(key), target, version, expires)
        return sign(store, ref, Path(key))
    if ref is None:
        raise UsageError("--format oms: name the directory (DIR)")
    if (out is None) == (signature is None):
        raise UsageError("--format oms: give --out SIG to sign DIR, or --signature SIG to record a signature of DIR")
    if signature is not None:
        if certificate is not None:
            raise UsageError("--certificate goes with --out (signing); give the trusted roots with --certificate-chain")
        return attach(store, Path(signature), Path(ref), [str(key)] if key is not None else [], list(chain))
    if key is None:
        raise UsageError("--format oms --out: give --key KEY.pem (an ECDSA private key)")
    if chain and certificate is None:
        raise UsageError("--certificate-chain goes with --certificate (the signing certificate)")
    tag = statements.terms(target, version, expires) if statement else None
    return sign_directory(store, Path(ref), Path(key), Path(out), certificate, list(chain), tag)


def sign_directory(store: StoreDir, directory: Path, key_path: Path, out: Path, certificate=None,
                   chain: list = (), tag: tuple[str, str, int, int] | None = None) -> OmsSignResult:
    """`tag` (repository, tag, version, expiry: statements.terms): the signature also carries a
    statement for that tag about the composition DIR's bundle holds, in its predicate."""
    from slm.distribution import statement
    from slm.distribution.bundle import parse_config

    tag_statement = None
    if tag is not None:
        comp_id = parse_config(_bundle_config(Path(directory)), f"{directory} config").composition_id
        tag_statement = statement.fields(comp_id, *tag)
    key = oms.load_private_key(Path(key_path))
    certificates = oms_certs.load_certificates([Path(certificate), *map(Path, chain)]) if certificate else None
    directory = Path(directory)
    real_out, real_dir = os.path.realpath(out), os.path.realpath(directory)
    if real_out == real_dir or real_out.startswith(real_dir.rstrip("/") + "/"):
        raise InvalidInput(f"--out {out}: the signature cannot be inside the directory it signs")
    with outputs.OutputFile(Path(out), store.root, "--out") as target:
        bundle = oms.sign_directory(directory, key, certificates, tag_statement)
        target.write(bundle)
        target.commit()
    public = oms.public_key_text(key)
    files = len(oms.verify_bundle(_json(bundle), key.public_key(), str(out)).resources)
    return OmsSignResult("oms", str(out), str(directory), files, public, signing.key_fingerprint(public))


def _json(data: bytes) -> dict:
    from slm.formats.jsonfile import parse_json_object

    return parse_json_object(data, "OMS signature", oms.MAX_BUNDLE_BYTES)


def _bundle_config(directory: Path) -> bytes:
    """The config blob of the bundle directory (an `slm export -o DIR` layout)."""
    reader = LayoutReader(directory)
    try:
        desc = reader.manifest_descriptor(None)
        manifest = parse_manifest(reader.blob(desc.digest, desc.size), f"{directory.name} manifest")
        config = reader.blob(manifest.config.digest, manifest.config.size)
    finally:
        reader.close()
    if sha256_of(config) != manifest.config.digest:
        raise IntegrityError(f"{directory}: the config blob does not hash to its name")
    return config


def attach(store: StoreDir, signature: Path, directory: Path, keys: list[str] = (), roots: list = ()) -> SignResult:
    from slm.distribution.bundle import parse_config

    bundle = oms.read_bundle_file(Path(signature))
    chain = oms_certs.bundle_chain(bundle, str(signature))
    if chain is not None:  # certificate mode: the chain to a trusted root gives the key
        leaf = oms_certs.check_chain(chain, oms_certs.load_certificates([Path(r) for r in roots]), str(signature))
        keys = [oms.public_key_text(leaf)]
    elif roots:
        raise UsageError("--certificate-chain: this signature was made with a key, not a certificate")
    candidates = [signing.public_key_from_file_or_text(k) for k in keys] or list(policy(store).trusted_keys)
    candidates = [k for k in candidates if oms.is_key_text(k)]
    if not candidates:
        raise InvalidInput("no ECDSA public key to check the OMS signature with: give --key PUB.pem "
                           "(or trust one in config.toml trusted_keys)")
    statement, public, failure = None, None, None
    for key_text in candidates:
        try:
            statement = oms.verify_bundle(bundle, oms.parse_public_key(key_text), str(signature))
            public = key_text
            break
        except IntegrityError as err:
            failure = err
    if statement is None:
        raise failure
    oms.check_directory(statement, Path(directory), str(signature))
    config = _bundle_config(Path(directory))
    comp_id = parse_config(config, f"{directory} config").composition_id
    blob = oms.store_signature(comp_id, public, config, bundle)
    signing.parse_signature(blob, comp_id, f"OMS signature {signature}")  # the check every reader makes
    with store.locked():
        try:
            compositions.find_id(store, comp_id)
        except NotFound:
            raise NotFound(f"{directory} holds composition {comp_id[:19]}, which is not in this store "
                           f"(import it first: slm import bundle {directory})") from None
        return add_signature(store, comp_id, blob, public)
