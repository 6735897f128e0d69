"""Ed25519 signatures over composition ids, and signed verification certificates; a signature
blob may also be an OpenSSF Model Signing bundle bound to its composition (slm.distribution.oms),
which parse_signature checks the same way (well-formed, for this id, valid under its key); so
may a statement for a tag (slm.distribution.statement), which signs its composition id too.

A signature blob (media type application/vnd.slm.signature.v1+json), canonical JSON:

    {"algorithm": "ed25519", "composition": "blake3:<id>", "public_key": "ed25519:<base64>",
     "schema": "slm.signature/1", "signature": "<base64 of 64 bytes>"}

What is signed is the canonical JSON of {"composition": <id>, "schema": "slm.signature/1"}: the
composition id is the BLAKE3 digest of the composition's canonical identity manifest, so the
signature covers the base, tokenizer, architecture, quantization profile, runtime and every
adapter with its weight and order. The schema string keeps a signature from being replayed as
anything else (a certificate signs a different schema).

A certificate (`slm verify --certificate FILE --key KEY`) is the same shape with schema
slm.certificate/1 and a "result" object (the verify report), the signature covering every
field but itself. Neither parser takes the other's document: a certificate is never a
signature (it does not count for require_signed), nor a signature a certificate.

Keys are PEM files as `openssl genpkey -algorithm ed25519` writes them (PKCS#8); public keys are
written `ed25519:<base64 of the 32 raw bytes>` (config.toml `trusted_keys`, `slm sign --json`).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path

from slm.distribution import oms, statement
from slm.distribution.bundle import MAX_CERT_BYTES, MAX_SIGNATURE_BYTES, canonical
from slm.errors import IntegrityError, InvalidInput
from slm.formats.jsonfile import parse_json_object
from slm.formats.untrusted import read_untrusted
from slm.store import digest as dg

SCHEMA = "slm.signature/1"
CERT_SCHEMA = "slm.certificate/1"
ALGORITHM = "ed25519"
KEY_PREFIX = "ed25519:"
MAX_KEY_FILE = 64 << 10


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as err:  # a runtime dependency; only a broken install lacks it
        raise InvalidInput("signatures need the 'cryptography' package (pip install cryptography)") from err
    return ed25519, serialization, InvalidSignature


@dataclass(frozen=True)
class Signature:
    composition: str
    public_key: str  # ed25519:<base64>

    @property
    def fingerprint(self) -> str:
        return key_fingerprint(self.public_key)


def key_fingerprint(public_key: str) -> str:
    """A short name for a public key (first 16 hex of BLAKE3 of its text)."""
    return dg.short(dg.of_bytes(public_key.encode("ascii")), 16)


def _read_key_file(path: Path) -> bytes:
    """A key file, through the one reader of untrusted files: a regular file (a FIFO or a device
    is refused, never waited on), at most MAX_KEY_FILE bytes. Missing: exit 3; not a regular
    file or too large: 4; the OS failing the read (EIO): 12."""
    return read_untrusted(path, MAX_KEY_FILE, "key file")


def load_private_key(path: Path):
    ed25519, serialization, _ = _crypto()
    path = Path(path)
    data = _read_key_file(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as err:
        raise InvalidInput(f"{path}: not an unencrypted PEM private key") from err
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise InvalidInput(f"{path}: not an Ed25519 key (make one with `openssl genpkey -algorithm ed25519`)")
    return key


def public_key_text(private_key) -> str:
    _, serialization, _ = _crypto()
    raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def parse_public_key(text: str, where: str = "public key"):
    """An `ed25519:<base64>` key, or an OMS signer's `ecdsa-p256:<base64 DER>` (slm.distribution.oms)."""
    ed25519, _, _ = _crypto()
    if oms.is_key_text(text):
        return oms.parse_public_key(text, where)
    if not isinstance(text, str) or not text.startswith(KEY_PREFIX):
        raise InvalidInput(f"{where}: {str(text)[:40]!r} is not an ed25519:<base64> (or ecdsa-p256:<base64>) "
                           "public key")
    try:
        raw = base64.b64decode(text[len(KEY_PREFIX):], validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidInput(f"{where}: not base64") from err
    if len(raw) != 32:
        raise InvalidInput(f"{where}: an Ed25519 public key is 32 bytes, not {len(raw)}")
    return ed25519.Ed25519PublicKey.from_public_bytes(raw)


def public_key_from_file_or_text(value: str) -> str:
    """`--key` of `slm verify --signature`: a key text, or a PEM public or private key file."""
    if value.startswith(KEY_PREFIX) or oms.is_key_text(value):
        parse_public_key(value)
        return value
    ed25519, serialization, _ = _crypto()
    path = Path(value)
    data = _read_key_file(path)
    ec_key = oms.public_key_from_pem(data, str(path))  # an OMS signer's EC key
    if ec_key is not None:
        return ec_key
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        return public_key_text(load_private_key(path))
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise InvalidInput(f"{path}: not an Ed25519 public key")
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def message(doc: dict) -> bytes:
    return canonical({k: v for k, v in doc.items() if k not in ("signature", "algorithm", "public_key")})


def sign(comp_id: str, private_key) -> bytes:
    """A signature blob for `comp_id`."""
    return sign_doc({"schema": SCHEMA, "composition": comp_id}, private_key)


def sign_doc(doc: dict, private_key) -> bytes:
    """`doc` signed with an Ed25519 private key: its canonical JSON with the algorithm, the
    public key and the signature of `message(doc)` (what verify_doc checks)."""
    sig = private_key.sign(message(doc))
    return canonical({**doc, "algorithm": ALGORITHM, "public_key": public_key_text(private_key),
                      "signature": base64.b64encode(sig).decode("ascii")})


def verify_doc(doc: dict, schema: str, what: str) -> str:
    """Check the signature of a signed document; returns its public key text."""
    _, _, invalid = _crypto()
    if doc.get("schema") != schema or doc.get("algorithm") != ALGORITHM:
        raise InvalidInput(f"{what}: not an {schema} {ALGORITHM} document")
    key_text = doc.get("public_key")
    if not isinstance(key_text, str) or not key_text.startswith(KEY_PREFIX):  # an EC key verifies no Ed25519 signature
        raise InvalidInput(f"{what}: public_key is not an {KEY_PREFIX}<base64> key")
    key = parse_public_key(key_text, what)
    try:
        sig = base64.b64decode(str(doc.get("signature")), validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidInput(f"{what}: signature is not base64") from err
    try:
        key.verify(sig, message(doc))
    except invalid as err:
        raise IntegrityError(f"{what}: the signature does not verify (tampered, or signed by another key)") from err
    return key_text


def parse_signature(data: bytes, comp_id: str, what: str = "signature") -> Signature:
    """A signature blob, checked: well-formed, for `comp_id`, and valid under its own key
    (whether that key is trusted is the policy's question)."""
    doc = parse_json_object(data, what, MAX_SIGNATURE_BYTES)
    if doc.get("schema") == oms.STORE_SCHEMA:  # an OpenSSF Model Signing bundle, bound to the id
        return Signature(comp_id, oms.check_store_signature(doc, comp_id, what))
    if doc.get("schema") == statement.SCHEMA:  # a statement for a tag also signs its composition
        signed = statement.parse_statement(data, what)
        if signed.composition != comp_id:
            raise IntegrityError(f"{what}: signs composition %s, not %s" % dg.short_pair(signed.composition, comp_id))
        return Signature(comp_id, signed.public_key)
    if set(doc) != {"schema", "composition", "algorithm", "public_key", "signature"}:
        raise InvalidInput(f"{what}: fields are not those of {SCHEMA}")
    if doc["composition"] != comp_id:
        signed, wanted = dg.short_pair(str(doc["composition"]), comp_id)
        raise IntegrityError(f"{what}: signs composition {signed}, not {wanted}")
    return Signature(comp_id, verify_doc(doc, SCHEMA, what))


def certificate(comp_id: str, result: dict, private_key) -> bytes:
    return sign_doc({"schema": CERT_SCHEMA, "composition": comp_id, "result": result}, private_key)


def check_certificate(data: bytes, what: str = "certificate") -> tuple[str, str, dict]:
    """(composition id, public key, result) of a certificate whose signature verifies."""
    doc = parse_json_object(data, what, MAX_CERT_BYTES)
    if set(doc) != {"schema", "composition", "result", "algorithm", "public_key", "signature"}:
        raise InvalidInput(f"{what}: fields are not those of {CERT_SCHEMA}")
    key = verify_doc(doc, CERT_SCHEMA, what)
    if not dg.is_digest(str(doc["composition"])) or not isinstance(doc["result"], dict):
        raise InvalidInput(f"{what}: malformed composition or result")
    return doc["composition"], key, doc["result"]


def check_certificate_of(data: bytes, comp_id: str, what: str = "certificate") -> tuple[str, dict]:
    """(public key, result) of a certificate of `comp_id` whose signature verifies."""
    certified, key, result = check_certificate(data, what)
    if certified != comp_id:
        raise IntegrityError(f"{what}: certifies composition %s, not %s" % dg.short_pair(certified, comp_id))
    return key, result
