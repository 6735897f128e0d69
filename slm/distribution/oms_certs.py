"""OMS certificate mode (slm.distribution.oms): the bundle's verificationMaterial carries the
signing certificate and the chain above it (x509CertificateChain, DER, base64) instead of a key
hint, as `model_signing sign certificate` writes it.

Checking follows `model_signing verify certificate`: the chain (signing certificate first) must
lead, each certificate directly issued by the next, to one of the trusted roots given; each is
valid at the signing certificate's notBefore (the signing time a certificate-mode bundle
implies: it carries no timestamp); the signing certificate may sign (KeyUsage digitalSignature,
or ExtendedKeyUsage codeSigning); its public key (ECDSA) is the one the envelope is checked
under. In the store the signature is then kept, like a key-mode one, under that public key
(slm trusts keys: trusted_keys), the chain having been checked when it was recorded.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from slm.errors import IntegrityError, InvalidInput
from slm.formats.untrusted import read_untrusted

MAX_CERT_FILE = 1 << 20
MAX_CHAIN = 16


def _x509():
    from cryptography import x509

    return x509


def load_certificates(paths: list[Path]) -> list:
    """The PEM certificates in `paths` (each a file of one or more), in order."""
    x509 = _x509()
    out = []
    for path in paths:
        data = read_untrusted(Path(path), MAX_CERT_FILE, "certificate file")
        try:
            out += x509.load_pem_x509_certificates(data)
        except ValueError as err:
            raise InvalidInput(f"{path}: not PEM certificates") from err
    return out


def chain_material(certificates: list) -> dict:
    from cryptography.hazmat.primitives import serialization

    return {"x509CertificateChain": {"certificates": [
        {"rawBytes": base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode("ascii")}
        for c in certificates]}, "tlogEntries": []}


def bundle_chain(bundle: dict, what: str) -> list | None:
    """The certificates of a certificate-mode bundle (signing certificate first), None for a
    key-mode one."""
    material = bundle.get("verificationMaterial")
    chain = material.get("x509CertificateChain") if isinstance(material, dict) else None
    if chain is None:
        return None
    certs = chain.get("certificates") if isinstance(chain, dict) else None
    if not isinstance(certs, list) or not 1 <= len(certs) <= MAX_CHAIN:
        raise InvalidInput(f"{what}: x509CertificateChain holds no certificates (or more than {MAX_CHAIN})")
    x509 = _x509()
    out = []
    for c in certs:
        try:
            out.append(x509.load_der_x509_certificate(base64.b64decode(str(c.get("rawBytes")), validate=True)))
        except (AttributeError, binascii.Error, ValueError) as err:
            raise InvalidInput(f"{what}: a certificate of its chain is not base64 DER") from err
    return out


def _may_sign(cert) -> bool:
    x509 = _x509()
    try:
        if cert.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature:
            return True
    except x509.ExtensionNotFound:
        pass
    try:
        return x509.oid.ExtendedKeyUsageOID.CODE_SIGNING in cert.extensions.get_extension_for_class(
            x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False


def check_chain(chain: list, roots: list, what: str):
    """The signing certificate's public key, once its chain leads to one of `roots`."""
    from cryptography.exceptions import InvalidSignature

    if not roots:
        raise InvalidInput(f"{what} is signed with a certificate: give the trusted root(s) with "
                           "--certificate-chain ROOT.pem")
    leaf = chain[0]
    when = leaf.not_valid_before_utc
    path = list(chain)
    for cert in path:
        if not cert.not_valid_before_utc <= when <= cert.not_valid_after_utc:
            raise IntegrityError(f"{what}: certificate {cert.subject.rfc4514_string()} is not valid at signing time")
    if not _may_sign(leaf):
        raise IntegrityError(f"{what}: the signing certificate may not sign (no digitalSignature or codeSigning)")
    for cert, issuer in zip(path, path[1:]):
        _issued(cert, issuer, what, InvalidSignature)
    top = path[-1]
    if any(top == root for root in roots):
        return leaf.public_key()
    for root in roots:
        try:
            top.verify_directly_issued_by(root)
        except (ValueError, TypeError, InvalidSignature):
            continue
        if root.not_valid_before_utc <= when <= root.not_valid_after_utc:
            return leaf.public_key()
    raise IntegrityError(f"{what}: its certificate chain does not lead to a trusted root")


def _issued(cert, issuer, what: str, invalid) -> None:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, invalid) as err:
        raise IntegrityError(f"{what}: certificate {cert.subject.rfc4514_string()} is not issued by the next "
                             "one in its chain") from err
