"""OMS certificate mode (slm.distribution.oms): the bundle's verificationMaterial carries the
signing certificate and the chain above it (x509CertificateChain, DER, base64) instead of a key
hint, as `model_signing sign certificate` writes it.

Checking is RFC 5280 path validation (cryptography.x509.verification; `model_signing verify
certificate` and `openssl verify` make the same checks with OpenSSL): the chain (signing
certificate first) must lead to one of the trusted roots given, every issuer on the way a CA
allowed to sign certificates within its path length, every link valid at the time of recording
and its signature checked; the signing certificate may sign (KeyUsage digitalSignature, or no
KeyUsage and ExtendedKeyUsage codeSigning); its public key (ECDSA) is the one the envelope is
checked under. In the store the signature is then kept, like a key-mode one, under that public
key (slm trusts keys: trusted_keys), the chain having been checked when it was recorded.
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
    """RFC 5280 4.2.1.12: a key usage present must allow digitalSignature whatever the extended
    key usage says; without one, the extended key usage must name codeSigning."""
    x509 = _x509()
    try:
        return cert.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature
    except x509.ExtensionNotFound:
        pass
    try:
        return x509.oid.ExtendedKeyUsageOID.CODE_SIGNING in cert.extensions.get_extension_for_class(
            x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False


def _verifier(roots: list, when):
    """cryptography's RFC 5280 path validation: every issuer a CA (basicConstraints cA) that may
    sign certificates (keyUsage keyCertSign), path lengths honoured, every link valid at `when`
    and its signature checked. The issuers keep the CA/B profile cryptography ships except that
    an extended key usage (codeSigning on an issuer is common outside the web PKI) is allowed;
    the signing certificate's own use is judged by _may_sign, not by a TLS profile."""
    from cryptography.x509 import ExtendedKeyUsage
    from cryptography.x509.verification import Criticality, ExtensionPolicy, PolicyBuilder, Store

    issuers = ExtensionPolicy.webpki_defaults_ca().may_be_present(ExtendedKeyUsage, Criticality.AGNOSTIC, None)
    return (PolicyBuilder().store(Store(roots)).time(when).max_chain_depth(MAX_CHAIN)
            .extension_policies(ca_policy=issuers, ee_policy=ExtensionPolicy.permit_all())
            .build_client_verifier())


def check_chain(chain: list, roots: list, what: str):
    """The signing certificate's public key, once a valid path leads from it through `chain` to
    one of `roots` now (a certificate-mode bundle carries no timestamp: the moment the signature
    is recorded is the only time slm can vouch for)."""
    import datetime

    from cryptography.x509.verification import VerificationError

    if not roots:
        raise InvalidInput(f"{what} is signed with a certificate: give the trusted root(s) with "
                           "--certificate-chain ROOT.pem")
    leaf = chain[0]
    if not _may_sign(leaf):
        raise IntegrityError(f"{what}: the signing certificate may not sign (its key usage lacks "
                             "digitalSignature, or it has none and no codeSigning)")
    try:
        _verifier(roots, datetime.datetime.now(datetime.timezone.utc)).verify(leaf, chain[1:])
    except (VerificationError, ValueError) as err:
        raise IntegrityError(f"{what}: its certificate chain does not lead to a trusted root ({err})") from err
    return leaf.public_key()
