"""OMS certificate mode against forged chains: `slm sign --format oms --signature` records a
certificate-mode signature only when its chain passes RFC 5280 path validation (every issuer a
CA allowed to sign certificates, within its path length, every link valid now). Each forged
chain here is one `openssl verify` refuses too, and slm refuses it with exit 5 and records
nothing; the honest chains beside them are recorded."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

import pytest

from helpers import refused, tiny_store

NOW = datetime.datetime.now(datetime.timezone.utc)
DAY = datetime.timedelta(days=1)


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key, issuer: str, issuer_key, *, ca: bool, path_length=None, sign=False,
          cert_sign=False, key_usage=True, valid=(-DAY, 30 * DAY)):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(NOW + valid[0]).not_valid_after(NOW + valid[1])
               .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True))
    if key_usage:
        builder = builder.add_extension(
            x509.KeyUsage(sign, False, False, False, False, cert_sign, cert_sign, False, False), critical=True)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, *certificates) -> Path:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates))
    return path


def _write_key(path: Path, key) -> Path:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def _chains():
    """name -> (signing key, [signing certificate, the rest of its chain], root, forged?)."""
    root_key, mid_key, low_key, leaf_key, evil_key = (_key() for _ in range(5))
    root = _cert("root", root_key, "root", root_key, ca=True, cert_sign=True)
    leaf = _cert("leaf", leaf_key, "root", root_key, ca=False, sign=True)
    mid0 = _cert("mid0", mid_key, "root", root_key, ca=True, path_length=0, cert_sign=True)
    low = _cert("low", low_key, "mid0", mid_key, ca=True, cert_sign=True)
    mid_no_cert_sign = _cert("mid", mid_key, "root", root_key, ca=True, sign=True)
    mid_expired = _cert("mid", mid_key, "root", root_key, ca=True, cert_sign=True, valid=(-30 * DAY, -DAY))
    mid = _cert("mid", mid_key, "root", root_key, ca=True, cert_sign=True)
    return {
        "through a CA": (evil_key, [_cert("evil", evil_key, "mid", mid_key, ca=False, sign=True), mid], root, False),
        "a CA:FALSE leaf as an issuer": (evil_key, [_cert("evil", evil_key, "leaf", leaf_key, ca=False, sign=True),
                                                    leaf], root, True),
        "past a pathLenConstraint": (evil_key, [_cert("evil", evil_key, "low", low_key, ca=False, sign=True), low,
                                                mid0], root, True),
        "an issuer without keyCertSign": (evil_key, [_cert("evil", evil_key, "mid", mid_key, ca=False, sign=True),
                                                     mid_no_cert_sign], root, True),
        "an expired issuer": (evil_key, [_cert("evil", evil_key, "mid", mid_key, ca=False, sign=True), mid_expired],
                              root, True),
        "a signing certificate without digitalSignature": (
            evil_key, [_cert("evil", evil_key, "mid", mid_key, ca=False, cert_sign=True), mid], root, True),
    }


CHAINS = _chains()


@pytest.fixture(scope="module")
def exported_template(tmp_path_factory, tiny_model):
    from slm.cli import run

    root = tmp_path_factory.mktemp("oms-chains")
    store = tiny_store(root, tiny_model, 1, steps=(("activate", "tq", "a1@0.5"),))
    assert run(["--store", str(store), "export", "-o", str(root / "export")]) == 0
    return store, root / "export"


@pytest.fixture
def exported(tmp_path, exported_template):
    import shutil

    store, out = exported_template
    shutil.copytree(store, tmp_path / "store", symlinks=True)
    return tmp_path / "store", out


@pytest.mark.hostile
@pytest.mark.parametrize("case", CHAINS)
def test_a_certificate_chain_is_recorded_only_when_openssl_would_validate_it(cli, tmp_path, exported, case):
    store, out = exported
    key, chain, root, forged = CHAINS[case]
    signing, rest = _write(tmp_path / "signing.pem", chain[0]), _write(tmp_path / "rest.pem", *chain[1:])
    ca = _write(tmp_path / "root.pem", root)
    made = cli("--store", store, "sign", "--format", "oms", "--key", _write_key(tmp_path / "key.pem", key),
               "--certificate", signing, "--certificate-chain", rest, "--out", tmp_path / "s.sig", out)
    assert made.code == 0, made.err
    openssl = subprocess.run(["openssl", "verify", "-CAfile", ca, "-untrusted", rest, signing],
                             capture_output=True, text=True, timeout=60)
    recording = ("sign", "--format", "oms", "--signature", tmp_path / "s.sig", "--certificate-chain", ca, out)
    if case == "a signing certificate without digitalSignature":
        assert openssl.returncode == 0  # openssl verify judges the path, not what the leaf is for
    else:
        assert (openssl.returncode != 0) == forged, openssl.stdout + openssl.stderr
    if forged:
        r = refused(cli, store, 5, *recording)
        assert "certificate" in r.err
    else:
        r = cli("--store", store, *recording)
        assert r.code == 0 and r.out.startswith("signed composition"), r.err
