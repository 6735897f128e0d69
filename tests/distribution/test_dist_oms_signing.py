"""OpenSSF Model Signing v1 (OMS) signatures: slm signs an exported directory and the
`model_signing` command line (the model-signing package: no slm code on that side) verifies it;
`model_signing sign key` signs an exported directory and slm records it, checks it
(`slm verify --signature`), lets it satisfy require_signed when its key is trusted, and carries it
in bundles. Ed25519 signatures stay readable beside it."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

from helpers import one_line, refused, snapshot, tiny_store

MODEL_SIGNING = str(Path(sys.executable).parent / "model_signing")
TIMEOUT_S = 300


def _ec_key(tmp_path: Path, name: str, curve: str = "SECP256R1") -> tuple[Path, Path]:
    """(private PEM, public PEM) of a new EC key, as `openssl ecparam -genkey` / `openssl ec -pubout` write."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(getattr(ec, curve)())
    private, public = tmp_path / f"{name}.pem", tmp_path / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _model_signing(*args) -> subprocess.CompletedProcess:
    return subprocess.run([MODEL_SIGNING, *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT_S)


def _policy(store: Path, trusted: list[str]) -> None:
    path = store / "config.toml"
    doc = tomlkit.parse(path.read_text())
    doc["require_signed"] = True
    doc["trusted_keys"] = trusted
    path.write_text(tomlkit.dumps(doc))


@pytest.fixture
def exported(cli, tmp_path, tiny_model):
    """A store with tiny + a LoRA active, and that composition exported to a directory."""
    store = tiny_store(tmp_path, tiny_model, 1, steps=(("activate", "tq", "a1@0.5"),))
    comp_id = cli("--store", store, "status", "--json").json()["active"]["id"]
    out = tmp_path / "export"
    assert cli("--store", store, "export", "-o", out).code == 0
    return store, comp_id, out


@pytest.mark.parametrize("curve", ["SECP256R1", "SECP384R1"])
def test_slm_oms_signature_verifies_with_model_signing(cli, tmp_path, exported, curve):
    store, _, out = exported
    key, pub = _ec_key(tmp_path, "signer", curve)
    before = snapshot(store)
    r = cli("--store", store, "sign", "--format", "oms", "--key", key, "--out", tmp_path / "model.sig", out, "--json")
    assert r.code == 0, r.err
    assert r.json()["files"] == len([p for p in out.rglob("*") if p.is_file()])
    assert snapshot(store) == before  # signing a directory does not touch the store
    checked = _model_signing("verify", "key", "--signature", tmp_path / "model.sig", "--public_key", pub, out)
    assert checked.returncode == 0, checked.stderr
    assert "Verification succeeded" in checked.stdout


def test_model_signing_rejects_slm_signature_after_a_file_changes(cli, tmp_path, exported):
    store, _, out = exported
    key, pub = _ec_key(tmp_path, "signer")
    assert cli("--store", store, "sign", "--format", "oms", "--key", key, "--out", tmp_path / "s.sig", out).code == 0
    (out / "index.json").write_bytes((out / "index.json").read_bytes() + b" ")
    checked = _model_signing("verify", "key", "--signature", tmp_path / "s.sig", "--public_key", pub, out)
    assert checked.returncode != 0


def test_model_signing_signature_satisfies_require_signed_when_trusted(cli, tmp_path, exported):
    store, comp_id, out = exported
    key, pub = _ec_key(tmp_path, "ci")
    made = _model_signing("sign", "key", "--private_key", key, "--signature", tmp_path / "ms.sig", out)
    assert made.returncode == 0, made.stderr
    trusted = cli("--store", store, "sign", "--format", "oms", "--signature", tmp_path / "ms.sig", "--key", pub,
                  out, "--json")
    assert trusted.code == 0, trusted.err
    assert trusted.json()["composition_id"] == comp_id and trusted.json()["added"]
    ecdsa_key = trusted.json()["public_key"]
    assert ecdsa_key.startswith("ecdsa-p256:")

    assert cli("--store", store, "activate", "tq").code == 0
    _policy(store, [])
    refused(cli, store, 6, "activate", "tq", "a1@0.5")  # signed, by a key nobody trusts yet
    _policy(store, [ecdsa_key])
    r = cli("--store", store, "activate", "tq", "a1@0.5", "--json")
    assert r.code == 0, r.err
    assert r.json()["active"]["id"] == comp_id
    report = cli("--store", store, "verify", "--signature", "--json").json()
    assert [(s["valid"], s["trusted"]) for s in report["signatures"]] == [(True, True)]


def test_a_signature_of_other_files_is_not_recorded(cli, tmp_path, exported):
    store, _, out = exported
    key, pub = _ec_key(tmp_path, "ci")
    assert _model_signing("sign", "key", "--private_key", key, "--signature", tmp_path / "ms.sig", out).returncode == 0
    (out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"} ')
    r = refused(cli, store, 5, "sign", "--format", "oms", "--signature", tmp_path / "ms.sig", "--key", pub, out)
    assert "oci-layout differs" in r.err


def test_a_signature_under_another_key_is_refused(cli, tmp_path, exported):
    store, _, out = exported
    key, _ = _ec_key(tmp_path, "ci")
    _, other_pub = _ec_key(tmp_path, "other")
    assert _model_signing("sign", "key", "--private_key", key, "--signature", tmp_path / "ms.sig", out).returncode == 0
    r = refused(cli, store, 5, "sign", "--format", "oms", "--signature", tmp_path / "ms.sig", "--key", other_pub, out)
    assert "another key" in r.err


def test_ed25519_key_is_refused_for_oms_with_the_reason(cli, tmp_path, exported):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    store, _, out = exported
    pem = tmp_path / "ed.pem"
    pem.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    r = refused(cli, store, 4, "sign", "--format", "oms", "--key", pem, "--out", tmp_path / "x.sig", out)
    assert "ECDSA" in r.err and not (tmp_path / "x.sig").exists()
    refused(cli, store, 4, "sign", "--format", "oms", "--key", pem, "--out", out / "inside.sig", out)


def test_oms_signature_travels_in_a_bundle_and_is_checked_on_receipt(cli, tmp_path, exported):
    store, comp_id, out = exported
    key, pub = _ec_key(tmp_path, "ci")
    assert cli("--store", store, "sign", "--format", "oms", "--key", key, "--out", tmp_path / "s.sig", out).code == 0
    assert cli("--store", store, "sign", "--format", "oms", "--signature", tmp_path / "s.sig", "--key", pub,
               out).code == 0
    # an Ed25519 signature beside it stays readable
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    ed = tmp_path / "ed.pem"
    ed.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    assert cli("--store", store, "sign", comp_id, "--key", ed).code == 0
    assert cli("--store", store, "export", "-o", tmp_path / "signed.tar").code == 0
    other = tmp_path / "other"
    assert cli("--store", other, "init").code == 0
    r = cli("--store", other, "import", "bundle", tmp_path / "signed.tar", "--json")
    assert r.code == 0, r.err
    assert r.json()["composition_id"] == comp_id and r.json()["signatures"] == 2
    report = cli("--store", other, "verify", "--signature", comp_id, "--key", pub, "--json").json()
    kinds = sorted((s["public_key"].split(":")[0], s["valid"], s["trusted"]) for s in report["signatures"])
    assert kinds == [("ecdsa-p256", True, True), ("ed25519", True, False)]


def test_forged_oms_payload_is_refused(cli, tmp_path, exported):
    """An OMS signature whose statement was changed after signing (a file renamed) is refused in
    one line, and nothing is recorded."""
    import base64

    store, comp_id, out = exported
    key, pub = _ec_key(tmp_path, "ci")
    assert cli("--store", store, "sign", "--format", "oms", "--key", key, "--out", tmp_path / "s.sig", out).code == 0
    bundle = json.loads((tmp_path / "s.sig").read_text())
    payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    payload["predicate"]["resources"][0]["name"] = "renamed"
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    (tmp_path / "forged.sig").write_text(json.dumps(bundle))
    r = refused(cli, store, 5, "sign", "--format", "oms", "--signature", tmp_path / "forged.sig", "--key", pub, out)
    assert one_line(r.err) and "does not verify" in r.err


def _ca_and_leaf(tmp_path: Path, name: str = "ca"):
    """A CA certificate and a code-signing leaf (EC P-256) it issued: (ca.pem, leaf key, leaf cert)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"slm test {name}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "signer")]))
            .issuer_name(ca_name).public_key(leaf_key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = tmp_path / f"{name}.pem", tmp_path / f"{name}-leaf.key.pem", tmp_path / f"{name}-leaf.pem"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    paths[2].write_bytes(leaf.public_bytes(pem))
    return paths


def test_certificate_mode_signature_verifies_with_model_signing(cli, tmp_path, exported):
    store, _, out = exported
    ca, key, cert = _ca_and_leaf(tmp_path)
    r = cli("--store", store, "sign", "--format", "oms", "--key", key, "--certificate", cert, "--out",
            tmp_path / "cert.sig", out)
    assert r.code == 0, r.err
    checked = _model_signing("verify", "certificate", "--signature", tmp_path / "cert.sig", "--certificate_chain", ca,
                             out)
    assert checked.returncode == 0, checked.stderr


def test_model_signing_certificate_signature_is_recorded_under_its_root(cli, tmp_path, exported):
    store, comp_id, out = exported
    ca, key, cert = _ca_and_leaf(tmp_path)
    other_ca, _, _ = _ca_and_leaf(tmp_path, "other")
    made = _model_signing("sign", "certificate", "--private_key", key, "--signing_certificate", cert,
                          "--certificate_chain", ca, "--signature", tmp_path / "ms.sig", out)
    assert made.returncode == 0, made.stderr
    r = refused(cli, store, 5, "sign", "--format", "oms", "--signature", tmp_path / "ms.sig", "--certificate-chain",
                other_ca, out)
    assert "trusted root" in r.err
    r = cli("--store", store, "sign", "--format", "oms", "--signature", tmp_path / "ms.sig", "--certificate-chain",
            ca, out, "--json")
    assert r.code == 0, r.err
    assert r.json()["composition_id"] == comp_id
    leaf_key = r.json()["public_key"]
    report = cli("--store", store, "verify", "--signature", "--key", leaf_key, "--json").json()
    assert [(s["valid"], s["trusted"]) for s in report["signatures"]] == [(True, True)]



def test_an_oms_statement_for_a_tag_verifies_with_model_signing_and_checks(cli, tmp_path, exported):
    """`slm sign --format oms --for REPO:TAG --version N --expires D --out SIG DIR` carries the
    statement in the in-toto predicate: model-signing's verifier (which reads only the
    predicate's resources and serialization) accepts it, an edit of the statement fails that
    verifier, and once recorded it is a statement check_statement reads under the EC key."""
    import time

    from slm.distribution.statement import Reason, check_statement, parse_statement
    from slm.store import StoreDir

    store, comp_id, out = exported
    key, pub = _ec_key(tmp_path, "signer")
    r = cli("--store", store, "sign", "--format", "oms", "--key", key, "--out", tmp_path / "stated.sig", out,
            "--for", "fleet/support:prod", "--version", "7", "--expires", "12h", "--json")
    assert r.code == 0, r.err
    checked = _model_signing("verify", "key", "--signature", tmp_path / "stated.sig", "--public_key", pub, out)
    assert checked.returncode == 0, checked.stderr
    doc = json.loads((tmp_path / "stated.sig").read_bytes())
    payload = base64.b64decode(doc["dsseEnvelope"]["payload"])
    edited = payload.replace(b'"version": 7', b'"version": 8')
    assert edited != payload
    doc["dsseEnvelope"]["payload"] = base64.b64encode(edited).decode()
    (tmp_path / "edited.sig").write_text(json.dumps(doc))
    assert _model_signing("verify", "key", "--signature", tmp_path / "edited.sig", "--public_key", pub, out).returncode != 0

    recorded = cli("--store", store, "sign", "--format", "oms", "--signature", tmp_path / "stated.sig", "--key", pub,
                   out, "--json")
    assert recorded.code == 0, recorded.err
    s = parse_statement(StoreDir.open(store).objects.read_verified(recorded.json()["signature"]))
    assert (s.composition, s.repository, s.tag, s.version) == (comp_id, "fleet/support", "prod", 7)
    v = check_statement(s, repository="fleet/support", tag="prod", now=time.time(), running=(6, comp_id),
                        trusted_keys=[recorded.json()["public_key"]])
    assert v.reason is Reason.NEWER
    # a plain OMS signature is not a statement
    assert cli("--store", store, "sign", "--format", "oms", "--key", key, "--out", tmp_path / "plain.sig", out).code == 0
    plain = cli("--store", store, "sign", "--format", "oms", "--signature", tmp_path / "plain.sig", "--key", pub,
                out, "--json")
    v = check_statement(StoreDir.open(store).objects.read_verified(plain.json()["signature"]), repository="fleet/support",
                        tag="prod", now=time.time(), running=None, trusted_keys=[plain.json()["public_key"]])
    assert v.reason is Reason.MALFORMED and "carries no statement" in v.message


def test_oms_statement_needs_out(cli, tmp_path, exported):
    store, _, out = exported
    key, _ = _ec_key(tmp_path, "signer")
    r = refused(cli, store, 2, "sign", "--format", "oms", "--signature", tmp_path / "x.sig", out,
                "--for", "fleet/x:y", "--version", "1", "--expires", "1d")
    assert "--out" in r.err


@pytest.mark.hostile
def test_an_oms_statement_naming_another_composition_than_its_bundle_is_refused(cli, tmp_path, exported):
    """The predicate's statement and the bundle it signs must name the same composition: one
    signed for composition X inside a signature of Y's bundle is refused (exit 5), though the
    signature itself holds for Y."""
    from cryptography.hazmat.primitives import serialization

    from slm.distribution import oms
    from slm.distribution.statement import Reason, check_statement, fields
    from slm.store import StoreDir

    store, comp_id, out = exported
    key, pub = _ec_key(tmp_path, "signer")
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    other = "blake3:" + "ab" * 32
    (tmp_path / "x.sig").write_bytes(oms.sign_directory(out, private, None,
                                                        fields(other, "fleet/support", "prod", 9, 4_000_000_000)))
    r = cli("--store", store, "sign", "--format", "oms", "--signature", tmp_path / "x.sig", "--key", pub, out, "--json")
    assert r.code == 0, r.err  # a valid OMS signature of the bundle of comp_id
    v = check_statement(StoreDir.open(store).objects.read_verified(r.json()["signature"]), repository="fleet/support",
                        tag="prod", now=0, running=None, trusted_keys=[r.json()["public_key"]])
    assert v.reason is Reason.BAD_SIGNATURE and "another composition" in v.message and comp_id != other
