"""Signed verify certificates travel with their composition: recorded by `slm verify
--certificate`, carried in bundles, pushed as referrers of their own artifactType and adopted
by `slm pull` (against Debian's docker-registry: the OCI 1.1 fallback tag), then checked by
`slm health` on the receiving store. A certificate is never a signature, nor a signature a
certificate; a hostile certificate referrer refuses the pull with the store unchanged."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomlkit

from dist_fixtures import attach_referrer, manifest_size, put_referrer, put_referrers_index
from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import refused, snapshot, tiny_store


def _key(path: Path, seed: int):
    """A deterministic Ed25519 key: (PEM path, private key, public text)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from slm.distribution.signing import public_key_text

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path, key, public_key_text(key)


def _config(store: Path, **values) -> None:
    path = store / "config.toml"
    doc = tomlkit.parse(path.read_text())
    doc.update(values)
    path.write_text(tomlkit.dumps(doc))


@dataclass
class Setup:
    a: Path  # tq + a1 active
    b: Path  # empty, trusting the CI key
    comp_id: str
    key: Path
    private: object
    public: str


@pytest.fixture
def setup(cli, tmp_path, tiny_model) -> Setup:
    a = tiny_store(tmp_path / "a", tiny_model, 1, steps=(("activate", "tq", "a1"),))
    key, private, public = _key(tmp_path / "ci.pem", 9)
    b = tmp_path / "b"
    assert cli("--store", b, "init").code == 0
    _config(b, trusted_keys=[public])
    return Setup(a, b, cli("--store", a, "status", "--json").json()["active"]["id"], key, private, public)


def _certify(cli, s: Setup, tmp_path: Path) -> str:
    """Verify A's composition with a certificate (recorded with it); its digest."""
    r = cli("--store", s.a, "verify", "--certificate", tmp_path / "cert.json", "--key", s.key, "--json")
    assert r.code == 0 and r.json()["recorded"], (r.code, r.err)
    return r.json()["recorded"]


def _recorded(store: Path, comp_id: str) -> list[str]:
    from slm.ops.ship import certificates
    from slm.store import StoreDir

    return [d for d, _ in certificates.recorded(StoreDir.open(store), comp_id)]


def _health(cli, store: Path, comp_id: str):
    r = cli("--store", store, "health", comp_id[7:19], "--json")
    return r.code, {c["name"]: (c["status"], c["reason"]) for c in r.json()["checks"]}


def test_a_certificate_travels_in_a_bundle_and_health_checks_it_there(cli, tmp_path, setup):
    digest = _certify(cli, setup, tmp_path)
    assert cli("--store", setup.a, "export", "-o", tmp_path / "bundle").code == 0
    got = cli("--store", setup.b, "import", "bundle", tmp_path / "bundle", "--json")
    assert got.code == 0, got.err
    assert got.json()["certificates"] == 1 and got.json()["signatures"] == 0
    assert _recorded(setup.b, setup.comp_id) == [digest]
    code, checks = _health(cli, setup.b, setup.comp_id)
    assert code == 0 and checks["certificate"][0] == "passed", checks


def test_a_certificate_is_not_a_signature_for_require_signed(cli, tmp_path, setup):
    _certify(cli, setup, tmp_path)
    _config(setup.a, require_signed=True, trusted_keys=[setup.public])
    before = snapshot(setup.a)
    r = cli("--store", setup.a, "activate", "tq")
    assert r.code == 6 and "is not signed" in r.err, r.err
    assert snapshot(setup.a) == before
    report = cli("--store", setup.a, "verify", "--signature", setup.comp_id[7:19], "--json").json()
    assert report["signatures"] == [] and not report["ok"]


def test_push_sends_the_certificate_as_its_own_referrer_and_pull_records_it(cli, tmp_path, setup,
                                                                           registry):  # noqa: F811
    from slm.distribution import mediatypes as mt

    digest = _certify(cli, setup, tmp_path)
    ref = f"{registry.host}/fleet/certified:v1"
    pushed = cli("--store", setup.a, "push", ref, "--json")
    assert pushed.code == 0, pushed.err
    assert pushed.json()["certificate_referrers"] == 1 and pushed.json()["referrers"] == 0
    manifest = pushed.json()["manifest_digest"]
    req = urllib.request.Request(f"http://{registry.host}/v2/fleet/certified/manifests/{manifest.replace(':', '-')}",
                                 headers={"Accept": mt.OCI_INDEX})
    (entry,) = json.loads(urllib.request.urlopen(req, timeout=60).read())["manifests"]
    assert entry["artifactType"] == mt.ARTIFACT_CERTIFICATE
    got = cli("--store", setup.b, "pull", ref, "--json")
    assert got.code == 0, got.err
    assert got.json()["certificates"] == 1 and got.json()["referrer_certificates"] == 1
    assert _recorded(setup.b, setup.comp_id) == [digest]
    code, checks = _health(cli, setup.b, setup.comp_id)
    assert code == 0 and checks["certificate"][0] == "passed", checks


@pytest.fixture
def pushed(cli, setup, registry):  # noqa: F811
    """A's composition pushed with no certificate or signature: (reference, manifest digest, size)."""
    ref = f"{registry.host}/fleet/plain:v1"
    r = cli("--store", setup.a, "push", ref, "--json")
    assert r.code == 0, r.err
    digest = r.json()["manifest_digest"]
    return ref, digest, manifest_size(registry.host, "fleet/plain", digest)


def _attach(registry, pushed, blob: bytes, as_signature: bool = False) -> None:  # noqa: F811
    from slm.distribution import mediatypes as mt

    _, digest, size = pushed
    kind = (mt.ARTIFACT_SIGNATURE, mt.SIGNATURE) if as_signature else (mt.ARTIFACT_CERTIFICATE, mt.CERTIFICATE)
    attach_referrer(registry.host, "fleet/plain", digest, size, blob, *kind)


def _answers_of(cli, s: Setup, spec: str, tmp_path: Path) -> dict:
    """The result (with golden answers) of a certificate of `spec`, as verify writes it."""
    from slm.distribution.signing import check_certificate

    out = tmp_path / f"{spec}.json"
    assert cli("--store", s.a, "verify", spec, "--certificate", out, "--key", s.key).code == 0
    return check_certificate(out.read_bytes())[2]


def test_a_pulled_certificate_whose_golden_answers_differ_fails_health(cli, tmp_path, setup, registry,
                                                                        pushed):  # noqa: F811
    """A certificate signed by the trusted key for tq+a1 carrying tq alone's golden answers (the
    numerics still pass: the bytes are right; an adapter changed the answer), attached to the
    pushed manifest: pulled and recorded, and the device's health check fails on it."""
    from slm.distribution.signing import certificate

    lying = certificate(setup.comp_id, _answers_of(cli, setup, "tq", tmp_path), setup.private)
    _attach(registry, pushed, lying)
    got = cli("--store", setup.b, "pull", pushed[0], "--json")
    assert got.code == 0, got.err
    assert got.json()["referrer_certificates"] == 1 and len(_recorded(setup.b, setup.comp_id)) == 1
    code, checks = _health(cli, setup.b, setup.comp_id)
    assert code == 18 and checks["certificate"][0] == "failed"
    assert "recorded certificate" in checks["certificate"][1] and "differs from the certified one" in checks["certificate"][1]


def _hostile(kind: str, s: Setup, cli, tmp_path: Path) -> tuple[bytes, bool, int, str]:
    """(blob, attached as a signature?, exit code, what the error says) of each hostile referrer."""
    from slm.distribution.bundle import MAX_CERT_BYTES
    from slm.distribution.signing import certificate, sign

    if kind == "oversized":
        return b" " * (MAX_CERT_BYTES + 1), False, 4, f"of at most {MAX_CERT_BYTES} bytes"
    if kind == "malformed":
        return b"{\"schema\": \"slm.certificate/1\"", False, 4, "certificate referrer"
    result = _answers_of(cli, s, s.comp_id[7:19], tmp_path)
    if kind == "wrong-composition":
        return certificate("blake3:" + "ab" * 32, result, s.private), False, 5, "certifies composition"
    if kind == "bad-signature":
        doc = json.loads(certificate(s.comp_id, result, s.private))
        doc["result"]["golden"][0]["tokens"][0] += 1
        return json.dumps(doc).encode(), False, 5, "does not verify"
    if kind == "certificate-as-signature":
        return certificate(s.comp_id, result, s.private), True, 4, "fields are not those of slm.signature/1"
    assert kind == "signature-as-certificate"
    return sign(s.comp_id, s.private), False, 4, "fields are not those of slm.certificate/1"


@pytest.mark.hostile
@pytest.mark.parametrize("kind", ["oversized", "malformed", "wrong-composition", "bad-signature",
                                  "certificate-as-signature", "signature-as-certificate"])
def test_a_hostile_certificate_referrer_refuses_the_pull(cli, tmp_path, setup, registry, pushed, kind):  # noqa: F811
    blob, as_signature, code, says = _hostile(kind, setup, cli, tmp_path)
    _attach(registry, pushed, blob, as_signature)
    r = refused(cli, setup.b, code, "pull", pushed[0])
    assert says in r.err and ("signature referrer" if as_signature else "certificate referrer") in r.err, r.err
    assert not (setup.b / "names" / "compositions").exists()


@pytest.mark.hostile
@pytest.mark.parametrize("listed_as", ["signatures", "certificates"])
def test_a_bundle_listing_a_certificate_as_a_signature_or_the_reverse_is_refused(cli, tmp_path, setup, listed_as):
    """A record that lists a certificate among its signatures (or a signature among its
    certificates), exported: the receiver checks each blob as what the record says it is."""
    from slm.distribution.signing import certificate, sign
    from slm.ops.ship.signing import list_blob
    from slm.store import StoreDir

    result = _answers_of(cli, setup, setup.comp_id[7:19], tmp_path)
    blob = certificate(setup.comp_id, result, setup.private) if listed_as == "signatures" \
        else sign(setup.comp_id, setup.private)
    store = StoreDir.open(setup.a)
    with store.locked():
        list_blob(store, setup.comp_id, blob, listed_as)
    assert cli("--store", setup.a, "export", "-o", tmp_path / "bundle").code == 0
    r = refused(cli, setup.b, 4, "import", "bundle", tmp_path / "bundle")
    assert f"slm.{'signature' if listed_as == 'signatures' else 'certificate'}/1" in r.err, r.err


@pytest.mark.hostile
def test_more_certificate_referrers_than_a_record_holds_refuse_the_pull_unread(cli, setup, registry,
                                                                              pushed):  # noqa: F811
    from slm.compose.composition import MAX_CERTIFICATES
    from slm.distribution import mediatypes as mt

    ref, digest, size = pushed
    entries = [put_referrer(registry.host, "fleet/plain", digest, size, b"junk %d" % i,
                            mt.ARTIFACT_CERTIFICATE, mt.CERTIFICATE) for i in range(MAX_CERTIFICATES + 1)]
    put_referrers_index(registry.host, "fleet/plain", digest, entries)
    r = refused(cli, setup.b, 4, "pull", ref)
    assert f"more than {MAX_CERTIFICATES} certificates" in r.err, r.err
