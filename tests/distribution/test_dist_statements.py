"""`slm sign --for REPO:TAG --version N --expires DURATION`: a signed statement for a tag,
stored with the composition's signatures, pushed as a referrer (Debian's docker-registry on
loopback), fetched back and checked (slm.distribution.statement.check_statement)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import tomlkit

from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import ed25519_key, refused, snapshot, tiny_store
from slm.distribution.statement import Reason, check_statement, check_statements, parse_statement



@pytest.fixture
def store_a(cli, tmp_path, tiny_model):
    a = tiny_store(tmp_path / "a", tiny_model, 1, steps=(("activate", "tq", "a1@0.5"),))
    return a, cli("--store", a, "status", "--json").json()["active"]["id"]


def _blob(store: Path, digest: str) -> bytes:
    from slm.store import StoreDir

    return StoreDir.open(store).objects.read_verified(digest)


def test_sign_for_a_tag_stores_a_statement_that_checks(cli, tmp_path, store_a):
    a, comp_id = store_a
    key, public = ed25519_key(tmp_path / "ci.pem", 1)
    before = time.time()
    r = cli("--store", a, "sign", "--key", key, "--for", "fleet/support:prod", "--version", "3",
            "--expires", "30d", "--json")
    assert r.code == 0, r.err
    out = r.json()
    assert (out["composition_id"], out["repository"], out["tag"], out["version"]) == (comp_id, "fleet/support", "prod", 3)
    assert out["added"] and out["signatures"] == 1 and out["public_key"] == public
    s = parse_statement(_blob(a, out["signature"]))
    assert s.expires_text == out["expires"]
    assert int(before) + 30 * 86400 <= s.expires <= time.time() + 30 * 86400
    v = check_statement(_blob(a, out["signature"]), repository="fleet/support", tag="prod", now=time.time(),
                        running=(2, "blake3:" + "0" * 64), trusted_keys=[public])
    assert v.reason is Reason.NEWER and v.statement == s
    # a statement signs its composition: verify --signature and require_signed count it
    report = cli("--store", a, "verify", "--signature", "--key", public, "--json")
    assert report.code == 0 and [x["trusted"] for x in report.json()["signatures"]] == [True]
    human = cli("--store", a, "sign", "--key", key, "--for", "localhost:5000/fleet/support:prod",
                "--version", "4", "--expires", "12h")
    assert human.code == 0 and "is version 4 of fleet/support:prod until" in human.out  # the host is dropped
    assert cli("--store", a, "fsck").code == 0


def test_plain_sign_output_is_unchanged_beside_statements(cli, tmp_path, store_a):
    a, comp_id = store_a
    key, public = ed25519_key(tmp_path / "ci.pem", 1)
    r = cli("--store", a, "sign", "--key", key, "--json")
    assert r.code == 0 and set(r.json()) == {"composition_id", "signature", "public_key", "fingerprint",
                                             "signatures", "added"}
    assert json.loads(_blob(a, r.json()["signature"]))["schema"] == "slm.signature/1"


@pytest.mark.parametrize("args, code, words", [
    (("--version", "0", "--expires", "30d"), 4, "--version"),
    (("--version", "-2", "--expires", "30d"), 4, "--version"),
    (("--version", str(1 << 53), "--expires", "30d"), 4, "--version"),
    (("--version", "1", "--expires", "367d"), 4, "--expires"),
    (("--version", "1", "--expires", "30s"), 4, "--expires"),
    (("--version", "1", "--expires", "0m"), 4, "--expires"),
    (("--version", "1"), 2, "go together"),
    (("--expires", "30d"), 2, "go together"),
])
def test_bad_statement_values_are_one_line_errors(cli, tmp_path, store_a, args, code, words):
    a, _ = store_a
    key, _ = ed25519_key(tmp_path / "ci.pem", 1)
    r = refused(cli, a, code, "sign", "--key", key, "--for", "fleet/support:prod", *args)
    assert words in r.err


@pytest.mark.parametrize("target", ["fleet/support", "Fleet/Support:prod", "fleet/support:", "fleet/support:a b",
                                    "fleet/support@sha256:" + "0" * 64, "x" * 2000 + ":t"])
def test_bad_targets_are_one_line_errors(cli, tmp_path, store_a, target):
    a, _ = store_a
    key, _ = ed25519_key(tmp_path / "ci.pem", 1)
    r = refused(cli, a, 4, "sign", "--key", key, "--for", target, "--version", "1", "--expires", "1d")
    assert "REPO:TAG" in r.err and len(r.err) < 500


def test_a_pushed_statement_is_fetched_back_and_checks(cli, tmp_path, registry, store_a):  # noqa: F811
    from slm.distribution.bundle import sha256_of
    from slm.distribution.reference import parse_reference
    from slm.distribution.registry import Registry
    from slm.ops.ship.statements import fetch_statements

    a, comp_id = store_a
    key, public = ed25519_key(tmp_path / "ci.pem", 2)
    assert cli("--store", a, "sign", "--key", key).code == 0  # a plain signature beside it
    for version, tag in ((7, "prod"), (2, "staging")):
        assert cli("--store", a, "sign", "--key", key, "--for", f"fleet/support:{tag}", "--version", str(version),
                   "--expires", "90m").code == 0
    ref = f"{registry.host}/fleet/support:prod"
    pushed = cli("--store", a, "push", ref, "--json")
    assert pushed.code == 0, pushed.err
    assert pushed.json()["referrers"] == 3

    client = Registry(parse_reference(ref), False)
    try:
        data = client.get_manifest("prod")
        found = fetch_statements(client, sha256_of(data))
    finally:
        client.close()
    assert sorted((s.tag, s.version, s.composition) for s in found) == [("prod", 7, comp_id), ("staging", 2, comp_id)]
    verdicts = {s.tag: check_statement(s, repository="fleet/support", tag="prod", now=time.time(),
                                       running=(6, "blake3:" + "0" * 64), trusted_keys=[public], composition=comp_id)
                for s in found}
    assert verdicts["prod"].reason is Reason.NEWER
    assert verdicts["staging"].reason is Reason.WRONG_TARGET
    chosen = check_statements(found, repository="fleet/support", tag="prod", now=time.time(),
                              running=(6, "blake3:" + "0" * 64), trusted_keys=[public], composition=comp_id)
    assert chosen.accepted and (chosen.statement.tag, chosen.statement.version) == ("prod", 7)
    assert check_statement(next(s for s in found if s.tag == "prod"), repository="fleet/support", tag="prod",
                           now=time.time(), running=(8, comp_id), trusted_keys=[public]).reason is Reason.ROLLBACK

    # a store that pulls the tag receives the statements as signatures of the composition
    b = tmp_path / "b"
    assert cli("--store", b, "init").code == 0
    doc = tomlkit.parse((b / "config.toml").read_text())
    doc["require_signed"], doc["trusted_keys"] = True, [public]
    (b / "config.toml").write_text(tomlkit.dumps(doc))
    got = cli("--store", b, "pull", ref, "--json")
    assert got.code == 0, got.err
    assert got.json()["signatures"] == 3
    assert cli("--store", b, "activate", comp_id[7:19]).code == 0


@pytest.mark.hostile
def test_an_edited_statement_in_the_store_fails_verify_signature(cli, tmp_path, store_a):
    """A statement whose version is raised after signing is a signature that does not verify."""
    from slm.distribution.bundle import canonical
    from slm.ops.ship.signing import add_signature
    from slm.store import StoreDir

    a, comp_id = store_a
    key, public = ed25519_key(tmp_path / "ci.pem", 1)
    r = cli("--store", a, "sign", "--key", key, "--for", "fleet/x:y", "--version", "1", "--expires", "1d", "--json")
    forged = canonical({**json.loads(_blob(a, r.json()["signature"])), "version": 99})
    store = StoreDir.open(a)
    with store.locked():
        add_signature(store, comp_id, forged, public)
    before = snapshot(a)
    report = cli("--store", a, "verify", "--signature", "--key", public, "--json")
    checks = sorted((s["valid"], s["problem"]) for s in report.json()["signatures"])
    assert [valid for valid, _ in checks] == [False, True] and "does not verify" in checks[0][1]
    assert snapshot(a) == before
