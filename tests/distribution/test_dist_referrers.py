"""Signatures as OCI referrers on pull, against Debian's docker-registry (distribution 2.8: no
referrers API, so the OCI 1.1 fallback tag `sha256-<hex>`): `slm pull` fetches the signature
referrers of the manifest it pulls, checks each for the composition before receiving anything,
and lists the ones the composition did not carry; a referrer that does not verify refuses the
pull with the store unchanged."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tomlkit

from dist_fixtures import attach_referrer as _attach_referrer, manifest_size as _manifest_size
from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import refused, snapshot, tiny_store


def _ed25519_key(path: Path, seed: int) -> tuple[Path, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from slm.distribution.signing import public_key_text

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path, public_key_text(key)


@pytest.fixture
def pushed_unsigned(cli, tmp_path, tiny_model, registry):  # noqa: F811
    """Store A: tiny + a LoRA active, pushed unsigned; a fresh store B."""
    a = tiny_store(tmp_path / "a", tiny_model, 1, steps=(("activate", "tq", "a1@0.5"),))
    comp_id = cli("--store", a, "status", "--json").json()["active"]["id"]
    ref = f"{registry.host}/fleet/ref:{comp_id[7:19]}"
    r = cli("--store", a, "push", ref, "--json")
    assert r.code == 0, r.err
    b = tmp_path / "b"
    assert cli("--store", b, "init").code == 0
    return a, b, comp_id, ref, r.json()["manifest_digest"]


def _signature_blob(a: Path, comp_id: str, key: Path, cli) -> bytes:
    """Sign the composition in store A and return the signature blob's bytes."""
    r = cli("--store", a, "sign", comp_id, "--key", key, "--json")
    assert r.code == 0, r.err
    from slm.store import StoreDir

    return StoreDir.open(a).objects.read_verified(r.json()["signature"])


def test_registry_has_no_referrers_api_so_the_fallback_tag_is_used(registry, pushed_unsigned):  # noqa: F811
    _, _, _, _, digest = pushed_unsigned
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://{registry.host}/v2/fleet/ref/referrers/{digest}", timeout=60)
    assert err.value.code == 404


def test_pull_adds_a_signature_found_only_as_a_referrer(cli, tmp_path, registry, pushed_unsigned):  # noqa: F811
    a, b, comp_id, ref, digest = pushed_unsigned
    key, public = _ed25519_key(tmp_path / "ci.pem", 3)
    blob = _signature_blob(a, comp_id, key, cli)
    _attach_referrer(registry.host, "fleet/ref", digest, _manifest_size(registry.host, "fleet/ref", digest), blob)
    r = cli("--store", b, "pull", ref, "--json")
    assert r.code == 0, r.err
    assert r.json()["referrer_signatures"] == 1 and r.json()["signatures"] == 1
    report = cli("--store", b, "verify", "--signature", comp_id, "--key", public, "--json").json()
    assert [(s["valid"], s["trusted"]) for s in report["signatures"]] == [(True, True)]
    doc = tomlkit.parse((b / "config.toml").read_text())
    doc["require_signed"], doc["trusted_keys"] = True, [public]
    (b / "config.toml").write_text(tomlkit.dumps(doc))
    assert cli("--store", b, "activate", comp_id[7:19]).code == 0


def test_pushed_signatures_come_back_as_referrers_once(cli, tmp_path, registry, tiny_model):  # noqa: F811
    a = tiny_store(tmp_path / "a", tiny_model, 1, steps=(("activate", "tq", "a1@0.5"),))
    key, _ = _ed25519_key(tmp_path / "ci.pem", 4)
    assert cli("--store", a, "sign", "--key", key).code == 0
    ref = f"{registry.host}/fleet/signed:v1"
    assert cli("--store", a, "push", ref).code == 0
    b = tmp_path / "b"
    assert cli("--store", b, "init").code == 0
    r = cli("--store", b, "pull", ref, "--json")
    assert r.code == 0, r.err
    assert r.json()["referrer_signatures"] == 1 and r.json()["signatures"] == 1  # the layer and referrer are one


def test_a_referrer_that_does_not_verify_refuses_the_pull(cli, tmp_path, registry, pushed_unsigned):  # noqa: F811
    a, b, comp_id, ref, digest = pushed_unsigned
    key, _ = _ed25519_key(tmp_path / "ci.pem", 5)
    doc = json.loads(_signature_blob(a, comp_id, key, cli))
    doc["composition"] = "blake3:" + "0" * 64  # a signature of another composition
    forged = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    _attach_referrer(registry.host, "fleet/ref", digest, _manifest_size(registry.host, "fleet/ref", digest), forged)
    before = snapshot(b)
    r = refused(cli, b, 5, "pull", ref)
    assert "signature referrer" in r.err
    assert snapshot(b) == before
