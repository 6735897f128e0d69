"""Ed25519 signatures over composition ids: `slm sign`, `slm verify --signature`, the store's
require_signed policy at activation, signatures travelling in bundles and as OCI referrers,
and signed verify certificates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomlkit

from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import TINY_LORA, one_line, snapshot
from slm.errors import IntegrityError

def _key(path: Path, seed: int) -> tuple[Path, str]:
    """A deterministic Ed25519 key (PEM, as openssl genpkey writes it) and its public text."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from slm.distribution.signing import public_key_text

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path, public_key_text(key)


def _policy(store: Path, trusted: list[str], required: bool = True) -> None:
    path = store / "config.toml"
    doc = tomlkit.parse(path.read_text())
    doc["require_signed"] = required
    doc["trusted_keys"] = trusted
    path.write_text(tomlkit.dumps(doc))


@pytest.fixture
def keys(tmp_path):
    return {"ci": _key(tmp_path / "ci.pem", 1), "other": _key(tmp_path / "other.pem", 2)}


@pytest.fixture
def signed_setup(cli, tmp_path, tiny_model):
    """Store A: tiny + LoRA, composition active (unsigned)."""
    import make_random_lora

    lora = make_random_lora.make_random_lora(tmp_path / "lora", seed=5, **TINY_LORA)
    a = tmp_path / "a"
    assert cli("--store", a, "init").code == 0
    assert cli("--store", a, "import", "base", tiny_model["gguf"], "--name", "tiny").code == 0
    assert cli("--store", a, "import", "adapter", lora, "--name", "demo").code == 0
    r = cli("--store", a, "activate", "tiny", "demo@0.5", "--json")
    assert r.code == 0
    return a, r.json()["active"]["id"]


def _refused_activation(cli, store: Path, *args) -> str:
    before = snapshot(store)
    r = cli("--store", store, "activate", *args)
    assert r.code == 6 and one_line(r.err), (r.code, r.err)
    assert snapshot(store) == before
    return r.err


def test_sign_keeps_the_id_and_verify_signature_checks_it(cli, signed_setup, keys):
    a, comp_id = signed_setup
    key, public = keys["ci"]
    r = cli("--store", a, "sign", "--key", key, "--json")
    assert r.code == 0, r.err
    assert r.json()["composition_id"] == comp_id and r.json()["public_key"] == public
    assert cli("--store", a, "status", "--json").json()["active"]["id"] == comp_id
    again = cli("--store", a, "sign", comp_id[7:19], "--key", key, "--json").json()
    assert not again["added"] and again["signatures"] == 1  # idempotent (Ed25519 is deterministic)
    ok = cli("--store", a, "verify", "--signature", "--key", public, "--json")
    assert ok.code == 0 and ok.json()["ok"] and ok.json()["signatures"][0]["trusted"]
    untrusted = cli("--store", a, "verify", "--signature", "--json")
    assert untrusted.code == 5 and not untrusted.json()["ok"]
    assert untrusted.json()["signatures"][0]["valid"]
    assert cli("--store", a, "fsck").code == 0
    assert cli("--store", a, "gc").code == 0  # the signature blob is reachable: kept
    assert cli("--store", a, "verify", "--signature", "--key", keys["ci"][0]).code == 0  # a PEM file works


def test_require_signed_refuses_unsigned_and_untrusted(cli, signed_setup, keys):
    a, comp_id = signed_setup
    assert cli("--store", a, "activate", "tiny").code == 0  # something else active first
    _policy(a, [keys["ci"][1]])
    assert "not signed" in _refused_activation(cli, a, "tiny", "demo@0.5")
    assert cli("--store", a, "sign", comp_id, "--key", keys["other"][0]).code == 0
    assert "untrusted" in _refused_activation(cli, a, "tiny", "demo@0.5")
    assert cli("--store", a, "sign", comp_id, "--key", keys["ci"][0]).code == 0
    r = cli("--store", a, "activate", "tiny", "demo@0.5", "--json")
    assert r.code == 0, r.err
    assert r.json()["active"]["id"] == comp_id
    # the base alone was never signed: going back to it is refused like any activation
    assert "not signed" in _refused_activation(cli, a, "tiny")


def test_a_bad_policy_is_a_one_line_error(cli, signed_setup):
    a, _ = signed_setup
    _policy(a, ["ed25519:not-base64!"])
    r = cli("--store", a, "activate", "tiny")
    assert r.code == 4 and one_line(r.err)


def test_signatures_travel_in_bundles(cli, tmp_path, signed_setup, keys):
    a, comp_id = signed_setup
    assert cli("--store", a, "sign", "--key", keys["ci"][0]).code == 0
    assert cli("--store", a, "export", "-o", tmp_path / "bundle").code == 0
    b = tmp_path / "b"
    assert cli("--store", b, "init").code == 0
    _policy(b, [keys["ci"][1]])
    got = cli("--store", b, "import", "bundle", tmp_path / "bundle", "--json")
    assert got.code == 0, got.err
    assert got.json()["signatures"] == 1
    assert cli("--store", b, "activate", comp_id).code == 0


def test_a_signature_over_another_id_or_edited_does_not_verify(cli, tmp_path, signed_setup, keys):
    """What the receiver and the policy check for every signature blob."""
    from slm.distribution import signing

    a, comp_id = signed_setup
    other = "blake3:" + "ab" * 32
    key = signing.load_private_key(keys["ci"][0])
    with pytest.raises(IntegrityError) as err:
        signing.parse_signature(signing.sign(other, key), comp_id)
    assert "signs composition" in str(err.value)
    tampered = json.loads(signing.sign(comp_id, key))
    tampered["composition"] = other
    with pytest.raises(IntegrityError, match="the signature does not verify"):
        signing.parse_signature(json.dumps(tampered).encode(), other)


def test_push_sends_signatures_as_referrers(cli, signed_setup, keys, registry):  # noqa: F811
    import urllib.request

    from slm.distribution import mediatypes as mt

    a, comp_id = signed_setup
    assert cli("--store", a, "sign", "--key", keys["ci"][0]).code == 0
    r = cli("--store", a, "push", f"{registry.host}/fleet/tiny:signed", "--json")
    assert r.code == 0, r.err
    assert r.json()["referrers"] == 1
    digest = r.json()["manifest_digest"]
    req = urllib.request.Request(f"http://{registry.host}/v2/fleet/tiny/manifests/{digest.replace(':', '-')}",
                                 headers={"Accept": mt.OCI_INDEX})
    index = json.loads(urllib.request.urlopen(req).read())
    (entry,) = index["manifests"]
    assert entry["artifactType"] == mt.ARTIFACT_SIGNATURE
    req = urllib.request.Request(f"http://{registry.host}/v2/fleet/tiny/manifests/{entry['digest']}",
                                 headers={"Accept": mt.OCI_MANIFEST})
    referrer = json.loads(urllib.request.urlopen(req).read())
    assert referrer["subject"]["digest"] == digest and referrer["layers"][0]["mediaType"] == mt.SIGNATURE


def test_verify_writes_a_signed_certificate_bound_to_the_id(cli, tmp_path, signed_setup, keys):
    from slm.errors import IntegrityError
    from slm.ops.ship.certificates import check_certificate

    a, comp_id = signed_setup
    cert = tmp_path / "cert.json"
    r = cli("--store", a, "verify", "--certificate", cert, "--key", keys["ci"][0], "--json")
    assert r.code == 0, r.err
    got = check_certificate(cert, [keys["ci"][1]])
    assert got["composition_id"] == comp_id and got["trusted"]
    assert got["result"]["numerics"]["ok"] and got["result"]["integrity"]["ok"]
    assert got["result"]["numerics"]["mode"] == "exact"  # the mode is part of what was certified
    doc = json.loads(cert.read_text())
    doc["result"]["numerics"]["max_abs_error"] = 0.0
    cert.write_text(json.dumps(doc))
    with pytest.raises(IntegrityError):
        check_certificate(cert)


def test_an_io_error_at_every_operation_of_sign_obeys_the_commit_point(cli, tmp_path, signed_setup, keys,
                                                                      monkeypatch):
    import shutil

    from slm.store import fs

    monkeypatch.setattr(fs, "fault_hook", None)  # the CLI installs a plan per run; none left after the test
    a, comp_id = signed_setup
    codes = []
    for n in range(1, 200):
        store = tmp_path / f"s{n}"
        shutil.copytree(a, store)
        before = snapshot(store)
        monkeypatch.setenv("SLM_FAULTS", f"eio@op={n}")
        r = cli("--store", store, "sign", "--key", keys["ci"][0])
        monkeypatch.delenv("SLM_FAULTS")
        codes.append(r.code)
        if r.code == 0:
            break
        assert one_line(r.err)
        if r.code == 12:
            assert snapshot(store) == before, f"op {n}"
        else:
            assert r.code == 13, (n, r.err)
        assert cli("--store", store, "fsck").code == 0, f"op {n}"
        signed = cli("--store", store, "verify", "--signature", "--key", keys["ci"][1]).code == 0
        assert signed == (r.code == 13), f"op {n}"
        shutil.rmtree(store)
    assert codes[-1] == 0 and 12 in codes


@pytest.mark.hostile
def test_a_signature_claiming_ed25519_with_an_ecdsa_key_is_a_one_line_refusal(signed_setup):
    """An OMS signer's EC key in an ed25519 signature document was an internal error (exit 1:
    the EC key's verify takes another argument); it is bad input (exit 4), as every malformed
    signature is."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    from slm.distribution import oms, signing
    from slm.errors import InvalidInput

    _, comp_id = signed_setup
    doc = json.loads(signing.sign(comp_id, ed25519.Ed25519PrivateKey.generate()))
    doc["public_key"] = oms.public_key_text(ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(InvalidInput, match="public_key is not an ed25519"):
        signing.parse_signature(json.dumps(doc).encode(), comp_id)
