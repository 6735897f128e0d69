"""OpenSSF Model Signing v1 (OMS) signatures, key mode, built and checked with `cryptography`
(the `model-signing` package signs and verifies the same files; slm does not depend on it).

An OMS signature of a directory is a Sigstore bundle (JSON, media type BUNDLE_MEDIA_TYPE) whose
DSSE envelope holds an in-toto statement:

    {"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE,
     "subject": [{"name": <the directory's name>, "digest": {"sha256": <hex>}}],
     "predicate": {"resources": [{"name": "blobs/sha256/..", "algorithm": "sha256", "digest": <hex>}, ..],
                   "serialization": {"method": "files", "hash_type": "sha256",
                                     "allow_symlinks": false, "ignore_paths": IGNORED}}}

one resource per regular file (path relative to the directory, "/"-separated, sorted), the
subject digest the sha256 of the resources' digests concatenated in that order. The envelope's
signature is ECDSA (P-256 with SHA-256, P-384 with SHA-384, P-521 with SHA-512: the curves OMS
key mode takes; `model_signing sign key` refuses Ed25519) over the DSSE pre-authentication
encoding of the payload; verificationMaterial.publicKey.hint is the sha256 of the public key's
PEM (SubjectPublicKeyInfo).

In the store an OMS signature of an exported bundle directory is kept as a signature blob
(slm.distribution.signing parses both kinds) that binds it to its composition:

    {"schema": STORE_SCHEMA, "composition": "blake3:..", "public_key": "ecdsa-p256:<base64 DER>",
     "config": "<base64 of the bundle's config blob>", "bundle": {<the OMS bundle>}}

It holds for a composition when the bundle verifies under `public_key` and its resources list
the config blob (its sha256 and name blobs/sha256/<hex>), whose composition_id is this one: the
signer signed a directory whose config names this composition.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from slm.distribution import oms_certs
from slm.distribution.bundle import canonical, parse_config
from slm.errors import IntegrityError, InvalidInput, NotFound
from slm.formats.jsonfile import parse_json_object
from slm.formats.untrusted import open_untrusted, read_untrusted

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
IGNORED = (".github", ".git", ".gitattributes", ".gitignore")  # model_signing's default
STORE_SCHEMA = "slm.oms-signature/1"
TAG_STATEMENT = "slm_statement"  # the predicate field of a statement for a tag (slm.distribution.statement)
MAX_BUNDLE_BYTES = 1 << 20
MAX_FILES = 100_000
MAX_KEY_FILE = 64 << 10
CURVES = {"secp256r1": ("ecdsa-p256:", "SHA256"), "secp384r1": ("ecdsa-p384:", "SHA384"),
          "secp521r1": ("ecdsa-p521:", "SHA512")}
_HASHING_CHUNK = 1 << 20


def _crypto():
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec, hashes, serialization, InvalidSignature


def is_key_text(text: object) -> bool:
    return isinstance(text, str) and any(text.startswith(p) for p, _ in CURVES.values())


# -- keys ----------------------------------------------------------------------------------------
def _curve(key, where: str) -> tuple[str, str]:
    ec, _, _, _ = _crypto()
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) or key.curve.name not in CURVES:
        raise InvalidInput(f"{where}: an OMS signature needs an ECDSA P-256, P-384 or P-521 key "
                           "(openssl ecparam -name prime256v1 -genkey -noout -out key.pem)")
    return CURVES[key.curve.name]


def load_private_key(path: Path):
    _, _, serialization, _ = _crypto()
    data = read_untrusted(Path(path), MAX_KEY_FILE, "key file")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as err:
        raise InvalidInput(f"{path}: not an unencrypted PEM private key") from err
    _curve(key, str(path))
    return key


def public_key_text(key) -> str:
    """`ecdsa-p256:<base64 of the DER SubjectPublicKeyInfo>` of a public or private EC key."""
    _, _, serialization, _ = _crypto()
    public = key.public_key() if hasattr(key, "public_key") else key
    prefix, _ = _curve(public, "key")
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return prefix + base64.b64encode(der).decode("ascii")


def parse_public_key(text: str, where: str = "public key"):
    _, _, serialization, _ = _crypto()
    prefix = next((p for p, _ in CURVES.values() if isinstance(text, str) and text.startswith(p)), None)
    if prefix is None:
        raise InvalidInput(f"{where}: {str(text)[:40]!r} is not an ecdsa-p256:<base64> public key")
    try:
        key = serialization.load_der_public_key(base64.b64decode(text[len(prefix):], validate=True))
    except (binascii.Error, ValueError, TypeError) as err:
        raise InvalidInput(f"{where}: not a base64 DER EC public key") from err
    if _curve(key, where)[0] != prefix:
        raise InvalidInput(f"{where}: the key is not on the curve {prefix[:-1]} names")
    return key


def public_key_from_pem(data: bytes, where: str) -> str | None:
    """The key text of a PEM EC public or private key, None if the PEM holds another kind."""
    ec, _, serialization, _ = _crypto()
    for load in (serialization.load_pem_public_key, lambda d: serialization.load_pem_private_key(d, None)):
        try:
            key = load(data)
        except (ValueError, TypeError):
            continue
        if isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
            return public_key_text(key)
        return None
    return None


def _hint(public) -> str:
    _, _, serialization, _ = _crypto()
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


# -- the directory's files -----------------------------------------------------------------------
def directory_digests(root: Path) -> list[tuple[str, str]]:
    """(relative path, sha256 hex) of every regular file under `root`, sorted, the IGNORED
    top-level names left out. A link or anything but a file or a directory is refused (OMS
    signs with allow_symlinks false)."""
    root = Path(root)
    if not root.is_dir():
        raise NotFound(f"no such directory: {root}") if not root.exists() else InvalidInput(f"{root} is not a directory")
    out: list[tuple[str, str]] = []
    todo = [""]
    while todo:
        rel_dir = todo.pop()
        for entry in sorted(os.scandir(root / rel_dir), key=lambda e: e.name):
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if not rel_dir and entry.name in IGNORED:
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                todo.append(rel)
            elif stat.S_ISREG(mode):
                out.append((rel, _sha256_file(root / rel)))
            else:
                raise InvalidInput(f"{root / rel}: not a regular file or a directory (links are not signed)")
            if len(out) > MAX_FILES:
                raise InvalidInput(f"{root}: more than {MAX_FILES} files")
    return sorted(out)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open_untrusted(path, follow=False) as f:
        for chunk in f.chunks(f.size):
            h.update(chunk)
    return h.hexdigest()


def _subject_digest(resources: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for _, digest in resources:
        h.update(bytes.fromhex(digest))
    return h.hexdigest()


def _pae(payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    return b"DSSEv1 %d %s %d %s" % (len(PAYLOAD_TYPE), PAYLOAD_TYPE.encode(), len(payload), payload)


# -- signing -------------------------------------------------------------------------------------
def sign_directory(root: Path, private_key, certificates: list | None = None,
                   tag_statement: dict | None = None) -> bytes:
    """The OMS bundle (JSON bytes) signing every file of `root`: key mode, or with
    `certificates` (the signing certificate of `private_key` first, then the chain above it)
    certificate mode (slm.distribution.oms_certs). `tag_statement`: a statement for a tag's
    fields (slm.distribution.statement), carried in the predicate beside the files."""
    ec, hashes, serialization, _ = _crypto()
    material = {"publicKey": {"hint": _hint(private_key.public_key())}, "tlogEntries": []}
    if certificates:
        spki = serialization.PublicFormat.SubjectPublicKeyInfo
        if certificates[0].public_key().public_bytes(serialization.Encoding.DER, spki) != \
                private_key.public_key().public_bytes(serialization.Encoding.DER, spki):
            raise InvalidInput("--certificate: the signing certificate is not for this --key")
        material = oms_certs.chain_material(certificates)
    resources = directory_digests(root)
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": Path(root).resolve().name, "digest": {"sha256": _subject_digest(resources)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "resources": [{"digest": d, "algorithm": "sha256", "name": n} for n, d in resources],
            "serialization": {"hash_type": "sha256", "ignore_paths": list(IGNORED), "allow_symlinks": False,
                              "method": "files"},
        },
    }
    if tag_statement is not None:
        statement["predicate"][TAG_STATEMENT] = tag_statement
    payload = json.dumps(statement, indent=2).encode("utf-8")
    _, hash_name = _curve(private_key, "key")
    sig = private_key.sign(_pae(payload), ec.ECDSA(getattr(hashes, hash_name)()))
    bundle = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": material,
        "dsseEnvelope": {"payload": base64.b64encode(payload).decode("ascii"), "payloadType": PAYLOAD_TYPE,
                         "signatures": [{"sig": base64.b64encode(sig).decode("ascii"), "keyid": ""}]},
    }
    return (json.dumps(bundle, indent=2) + "\n").encode("utf-8")


# -- checking ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Statement:
    subject_name: str
    resources: dict[str, str]  # relative path -> sha256 hex
    tag_statement: dict | None = None  # the predicate's TAG_STATEMENT, if it carries one


def _b64(value, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidInput(f"{what}: not base64") from err


def verify_bundle(bundle: dict, public_key, what: str) -> Statement:
    """The statement of an OMS bundle whose signature verifies under `public_key`
    (IntegrityError if it does not; InvalidInput if the bundle is malformed)."""
    ec, hashes, _, invalid = _crypto()
    if not isinstance(bundle, dict) or not isinstance(bundle.get("dsseEnvelope"), dict):
        raise InvalidInput(f"{what}: not a Sigstore bundle with a DSSE envelope")
    if not str(bundle.get("mediaType", "")).startswith("application/vnd.dev.sigstore.bundle"):
        raise InvalidInput(f"{what}: mediaType {bundle.get('mediaType')!r} is not a Sigstore bundle's")
    envelope = bundle["dsseEnvelope"]
    sigs = envelope.get("signatures")
    if envelope.get("payloadType") != PAYLOAD_TYPE or not isinstance(sigs, list) or len(sigs) != 1 \
            or not isinstance(sigs[0], dict):
        raise InvalidInput(f"{what}: the envelope is not one signature over an in-toto statement")
    material = bundle.get("verificationMaterial")
    chain = oms_certs.bundle_chain(bundle, what)
    if chain is not None:  # certificate mode: the signing certificate's key (its chain is checked
        # when the signature is recorded: oms_certs.check_chain)
        if public_key_text(chain[0].public_key()) != public_key_text(public_key):
            raise IntegrityError(f"{what}: signed by another key (its signing certificate's)")
    hint = material.get("publicKey", {}).get("hint") if isinstance(material, dict) else None
    if chain is None and hint and hint != _hint(public_key):
        raise IntegrityError(f"{what}: signed by another key (its key hint does not match)")
    payload = _b64(envelope.get("payload"), what + " payload")
    _, hash_name = _curve(public_key, what)
    try:
        public_key.verify(_b64(sigs[0].get("sig"), what + " signature"), _pae(payload),
                          ec.ECDSA(getattr(hashes, hash_name)()))
    except invalid as err:
        raise IntegrityError(f"{what}: the signature does not verify (tampered, or signed by another key)") from err
    return _statement(payload, what)


def _statement(payload: bytes, what: str) -> Statement:
    doc = parse_json_object(payload, what + " statement", MAX_BUNDLE_BYTES)
    predicate = doc.get("predicate")
    subject = doc.get("subject")
    if doc.get("_type") != STATEMENT_TYPE or doc.get("predicateType") != PREDICATE_TYPE \
            or not isinstance(predicate, dict) or not isinstance(subject, list) or len(subject) != 1:
        raise InvalidInput(f"{what}: not an OMS v1 statement (predicateType {PREDICATE_TYPE})")
    serialization = predicate.get("serialization")
    if not isinstance(serialization, dict) or serialization.get("method") != "files" \
            or serialization.get("hash_type") != "sha256":
        raise InvalidInput(f"{what}: only the 'files' serialization with sha256 is supported")
    resources: list[tuple[str, str]] = []
    for r in predicate.get("resources") or ():
        if not isinstance(r, dict) or r.get("algorithm") != "sha256" or not isinstance(r.get("name"), str) \
                or not isinstance(r.get("digest"), str) or len(r["digest"]) != 64:
            raise InvalidInput(f"{what}: a resource is not a sha256 file digest")
        resources.append((r["name"], r["digest"].lower()))
    try:
        subject_digest = subject[0]["digest"]["sha256"]
        computed = _subject_digest(resources)
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidInput(f"{what}: malformed subject or resource digests") from err
    if subject_digest != computed:
        raise IntegrityError(f"{what}: the subject digest does not match its resources")
    if len(dict(resources)) != len(resources):
        raise InvalidInput(f"{what}: a file is listed twice")
    tag_statement = predicate.get(TAG_STATEMENT)
    if tag_statement is not None and not isinstance(tag_statement, dict):
        raise InvalidInput(f"{what}: the predicate's {TAG_STATEMENT} is not an object")
    return Statement(str(subject[0].get("name", "")), dict(resources), tag_statement)


def claims_tag_statement(bundle) -> bool:
    """Whether an OMS bundle's predicate has a TAG_STATEMENT field, read without verifying
    anything (to sort signatures; check_store_statement is what checks one)."""
    try:
        payload = _b64(bundle["dsseEnvelope"]["payload"], "OMS payload")
        predicate = parse_json_object(payload, "OMS statement", MAX_BUNDLE_BYTES).get("predicate")
    except (InvalidInput, KeyError, TypeError):
        return False
    return isinstance(predicate, dict) and TAG_STATEMENT in predicate


def read_bundle_file(path: Path) -> dict:
    data = read_untrusted(Path(path), MAX_BUNDLE_BYTES, "OMS signature")
    return parse_json_object(data, str(path), MAX_BUNDLE_BYTES)


def check_directory(statement: Statement, root: Path, what: str) -> None:
    """The directory holds exactly the files the statement signs, with their digests."""
    actual = dict(directory_digests(root))
    if actual != statement.resources:
        changed = sorted(n for n in actual.keys() & statement.resources.keys() if actual[n] != statement.resources[n])
        extra = sorted(actual.keys() - statement.resources.keys())
        missing = sorted(statement.resources.keys() - actual.keys())
        first = (f"{changed[0]} differs" if changed else f"{extra[0]} is not signed" if extra
                 else f"{missing[0]} is missing")
        raise IntegrityError(f"{what}: {root} is not what was signed ({first})")


# -- in the store --------------------------------------------------------------------------------
def store_signature(comp_id: str, public_key_text_: str, config: bytes, bundle: dict) -> bytes:
    return canonical({"schema": STORE_SCHEMA, "composition": comp_id, "public_key": public_key_text_,
                      "config": base64.b64encode(config).decode("ascii"), "bundle": bundle})


def check_store_signature(doc: dict, comp_id: str, what: str) -> str:
    """The public key text of a stored OMS signature that holds for `comp_id`."""
    return check_store_statement(doc, comp_id, what)[0]


def check_store_statement(doc: dict, comp_id: str, what: str) -> tuple[str, Statement]:
    """(public key text, the signed statement) of a stored OMS signature that holds for `comp_id`."""
    if set(doc) != {"schema", "composition", "public_key", "config", "bundle"}:
        raise InvalidInput(f"{what}: fields are not those of {STORE_SCHEMA}")
    key_text = doc["public_key"]
    statement = verify_bundle(doc["bundle"], parse_public_key(key_text, what), what)
    config = _b64(doc["config"], what + " config")
    name = "blobs/sha256/" + hashlib.sha256(config).hexdigest()
    if statement.resources.get(name) != name.rsplit("/", 1)[1]:
        raise IntegrityError(f"{what}: the signed files do not include the bundle config it names")
    signed = parse_config(config, what + " config").composition_id
    if signed != comp_id or doc["composition"] != comp_id:
        raise IntegrityError(f"{what}: signs a bundle of composition {signed[:19]}, not {comp_id[:19]}")
    return key_text, statement
