"""Attacks on a device that follows a tag (`slm follow REF --once`, in-process), each refused
with its documented exit code (docs/exit-codes.md), the device's store unchanged and its good
composition still running: the tag moved back to an older signed version (14), a statement
giving the running version to another composition, or two giving one version to two
compositions (15), an expired statement (16), a statement for another tag or another
composition (17), an unsigned composition and one signed only by an untrusted key (6), a
manifest whose blobs do not match (5), a registry that is down (12). Beside them: a composition
marked bad is not tried again when signed anew, and `slm push` moves the tag only once the
statements of what it names are there.

The registry is Debian's docker-registry on loopback (tests/distribution/dist_fixtures.py); the
compositions are the synthetic tiny model's (helpers.tiny_store) with random LoRA adapters, so
each device pulls and checks its composition in a moment. Each test follows a repository of
its own, from a publisher's store of its own."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from dist_fixtures import local_registry, registry  # noqa: F401  (fixture)
from fleet_follow_fixtures import (REPOSITORY, TAG, active_id, activate, add_statement, device,
                                   private_key, publish, push, sign)
from helpers import copy_store, ed25519_key, snapshot, tiny_store

pytestmark = pytest.mark.hostile


@pytest.fixture(scope="module")
def publisher_template(tmp_path_factory, tiny_model) -> Path:
    """The tiny base and adapters a1..a4: a1 makes version 2, a2 version 4, a3 the attacks'
    compositions and a4 only the one whose blobs are tampered with in the registry."""
    return tiny_store(tmp_path_factory.mktemp("publisher"), tiny_model, 4)


class Fleet:
    """A publisher that published version 2 (a1) then version 4 (a2) of its own repository, and
    a device that followed it and runs version 4, marked good."""

    def __init__(self, cli, tmp_path: Path, template: Path, host: str, repository: str):
        self.cli = cli
        self.publisher = copy_store(template, tmp_path / "publisher")
        self.key, self.public = ed25519_key(tmp_path / "ci.pem", 1)
        self.stranger, _ = ed25519_key(tmp_path / "stranger.pem", 9)
        self.repository = repository
        self.ref = f"{host}/{repository}:{TAG}"
        self.v2 = publish(cli, self.publisher, self.ref, self.key, 2, "a1@0.5", target=self.target)
        self.v4 = publish(cli, self.publisher, self.ref, self.key, 4, "a2@0.5", target=self.target)
        self.device = device(tmp_path / "device", self.public)
        first = self.follow()
        assert first.code == 0, first.err
        assert active_id(cli, self.device) == self.v4

    @property
    def target(self) -> str:
        return f"{self.repository}:{TAG}"

    def follow(self):
        return self.cli("--store", self.device, "follow", self.ref, "--once", "--json")

    def refused(self, code: int, words: str) -> None:
        """A round refused with `code` and a line naming `words`, the store as it was, the good
        version 4 still active and marked good, the refusal in the follower's status."""
        before = snapshot(self.device)
        r = self.follow()
        assert r.code == code, (r.code, r.out, r.err)
        assert words in r.err and r.err.count("\n") == 1, r.err
        assert r.json()["exit_code"] == code and words in r.json()["error"]
        assert snapshot(self.device) == before
        assert active_id(self.cli, self.device) == self.v4
        status = self.cli("--store", self.device, "follow", "--status", "--json").json()
        assert (status["good"]["version"], status["good"]["composition"], status["trial"]) == (4, self.v4, None)
        assert (status["last_outcome"], status["last_exit_code"]) == ("error", code)


@pytest.fixture
def fleet(cli, tmp_path, publisher_template, registry, request):  # noqa: F811
    repository = "fleet/" + request.node.name.lower().removeprefix("test_")[:35].rstrip("_")  # the test's own
    return Fleet(cli, tmp_path, publisher_template, registry.host, repository)


def test_the_tag_moved_back_to_an_older_signed_version_is_a_rollback(fleet):
    push(fleet.cli, fleet.publisher, fleet.ref, fleet.v2)  # v2's statement travels with it: still valid
    fleet.refused(14, "older than version 4 running")


def test_a_statement_giving_the_running_version_to_another_composition_is_an_equivocation(fleet):
    other = activate(fleet.cli, fleet.publisher, "a3@0.5")
    sign(fleet.cli, fleet.publisher, other, fleet.key, 4, target=fleet.target)
    push(fleet.cli, fleet.publisher, fleet.ref, other)
    fleet.refused(15, "equivocation")


def test_an_expired_statement_is_a_freeze(fleet):
    from slm.distribution import statement

    newer = activate(fleet.cli, fleet.publisher, "a3@0.5")
    blob = statement.sign(newer, fleet.repository, TAG, 5, int(time.time()) - 60, private_key(fleet.key))
    add_statement(fleet.publisher, newer, blob, fleet.public)
    push(fleet.cli, fleet.publisher, fleet.ref, newer)
    fleet.refused(16, "expired at")


def test_a_statement_for_another_tag_is_a_mix_and_match(fleet):
    newer = activate(fleet.cli, fleet.publisher, "a3@0.5")
    sign(fleet.cli, fleet.publisher, newer, fleet.key, 5, target=f"{fleet.repository}:staging")
    sign(fleet.cli, fleet.publisher, newer, fleet.key, 5, target=f"{REPOSITORY}-other:{TAG}")
    push(fleet.cli, fleet.publisher, fleet.ref, newer)
    fleet.refused(17, f"not {fleet.target}")


def test_an_unsigned_composition_is_refused(fleet):
    unsigned = activate(fleet.cli, fleet.publisher, "a3@0.5")
    push(fleet.cli, fleet.publisher, fleet.ref, unsigned)
    fleet.refused(6, "no signed statement")


def test_a_composition_signed_only_by_an_untrusted_key_is_refused(fleet):
    newer = activate(fleet.cli, fleet.publisher, "a3@0.5")
    sign(fleet.cli, fleet.publisher, newer, fleet.stranger, 5, target=fleet.target)
    assert fleet.cli("--store", fleet.publisher, "sign", newer, "--key", fleet.stranger).code == 0  # plain, too
    push(fleet.cli, fleet.publisher, fleet.ref, newer)
    fleet.refused(6, "not a trusted key")


def test_a_manifest_whose_blobs_do_not_match_is_refused(fleet, registry):  # noqa: F811
    """Version 5 signed as it should be, then each of its blobs the device lacks (a4's) altered
    in the registry's storage, its size kept: the pull that follows the statement's check
    refuses the bytes."""
    running = set(_layers(fleet.ref))
    newer = publish(fleet.cli, fleet.publisher, fleet.ref, fleet.key, 5, "a4@0.5", target=fleet.target)
    tampered = 0
    for digest in set(_layers(fleet.ref)) - running:
        path = registry.blob_path(digest)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        tampered += 1
    assert tampered >= 1 and newer != fleet.v4
    fleet.refused(5, "does not hash to its sha256 digest")


def test_a_registry_that_is_down_changes_nothing(cli, tmp_path, publisher_template):
    (tmp_path / "registry").mkdir()
    with local_registry(tmp_path / "registry") as down:
        fleet = Fleet(cli, tmp_path, publisher_template, down.host, "fleet/down")
        publish(cli, fleet.publisher, fleet.ref, fleet.key, 5, "a3@0.5", target=fleet.target)
    fleet.refused(12, down.host)


def _manifest_bytes(ref: str, tag: str) -> bytes:
    from slm.distribution.reference import parse_reference
    from slm.distribution.registry import Registry

    client = Registry(parse_reference(ref), False)
    try:
        data = client.get_manifest(tag)
    finally:
        client.close()
    assert data is not None, tag
    return data


def _layers(ref: str) -> list[str]:
    """The blobs of the manifest the tag names now, but its signatures (the statements'
    referrers share them: altering one is another attack, a signature that does not verify)."""
    from slm.distribution import mediatypes as mt
    from slm.distribution.bundle import parse_manifest

    return [layer.sha256 for layer in parse_manifest(_manifest_bytes(ref, TAG), "manifest").layers
            if layer.media_type != mt.SIGNATURE]


def _beside(fleet, comp_id: str, blob: bytes) -> None:
    """A statement listed with `comp_id` as its signatures are, so that `slm push` sends it as a
    referrer of its manifest (add_signature refuses one for another composition: the registry
    is what mixes them)."""
    from slm.ops.ship.signing import list_blob
    from slm.store import StoreDir

    store = StoreDir.open(fleet.publisher)
    with store.locked():
        list_blob(store, comp_id, blob, "signatures")


def test_two_statements_giving_one_version_to_two_compositions_are_an_equivocation(fleet):
    """Version 5 of the tag signed for the composition the tag names and, beside it on the same
    manifest, for another: the key said two things, so neither is followed."""
    from slm.distribution import statement

    newer = activate(fleet.cli, fleet.publisher, "a3@0.5")
    other = activate(fleet.cli, fleet.publisher, "a3@0.6")
    sign(fleet.cli, fleet.publisher, newer, fleet.key, 5, target=fleet.target)
    _beside(fleet, newer, statement.sign(other, fleet.repository, TAG, 5, int(time.time()) + 3600,
                                         private_key(fleet.key)))
    push(fleet.cli, fleet.publisher, fleet.ref, newer)
    fleet.refused(15, "two statements give version 5")


def test_a_statement_for_another_composition_is_a_mix_and_match(fleet):
    """The tag names a composition whose manifest carries only a statement for another one."""
    from slm.distribution import statement

    newer = activate(fleet.cli, fleet.publisher, "a3@0.5")
    other = activate(fleet.cli, fleet.publisher, "a3@0.6")
    _beside(fleet, newer, statement.sign(other, fleet.repository, TAG, 5, int(time.time()) + 3600,
                                         private_key(fleet.key)))
    push(fleet.cli, fleet.publisher, fleet.ref, newer)
    fleet.refused(17, "statement is for composition")


def test_a_composition_marked_bad_is_not_pulled_again_under_a_new_version(fleet):
    """Version 5 fails the operator's health.d check and is marked bad; the publisher (or a
    registry replaying it) signs the same composition again as version 6, a manifest of
    another digest: the device knows the composition and neither pulls nor tries it again."""
    newer = activate(fleet.cli, fleet.publisher, "a3@0.5")
    script = fleet.device / "health.d" / "operator"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\n[ "$SLM_COMPOSITION" != "{newer}" ] || {{ echo "not this one" >&2; exit 1; }}\n')
    script.chmod(0o755)
    sign(fleet.cli, fleet.publisher, newer, fleet.key, 5, target=fleet.target)
    push(fleet.cli, fleet.publisher, fleet.ref, newer)
    tried = fleet.follow()
    assert tried.code == 18 and tried.json()["outcome"] == "rolled-back", (tried.out, tried.err)
    first_digest = _manifest_digest(fleet.ref)
    sign(fleet.cli, fleet.publisher, newer, fleet.key, 6, target=fleet.target)
    push(fleet.cli, fleet.publisher, fleet.ref, newer)
    assert _manifest_digest(fleet.ref) != first_digest  # (a new signature is a new layer)

    before = snapshot(fleet.device)
    again = fleet.follow()
    assert again.code == 18 and again.json()["outcome"] == "known-bad", (again.out, again.err)
    assert "marked bad" in again.json()["message"]
    assert snapshot(fleet.device) == before
    status = fleet.cli("--store", fleet.device, "follow", "--status", "--json").json()
    assert (status["active"], status["good"]["version"]) == (fleet.v4, 4)
    assert [(b["composition"], b["manifest"]) for b in status["bad"]] == [(newer, first_digest)]


def _manifest_digest(ref: str) -> str:
    from slm.distribution.bundle import sha256_of

    return sha256_of(_manifest_bytes(ref, TAG))


def test_a_push_moves_the_tag_only_once_its_statements_are_there(cli, tmp_path, publisher_template):
    """A follower that resolves the tag while `slm push` runs must find the statements of what
    the tag names: the manifest goes up by digest, then its referrers (and the fallback index
    that lists them, distribution 2.8 having no referrers API), and the tag moves last. Read in
    the registry's access log."""
    (tmp_path / "registry").mkdir()
    with local_registry(tmp_path / "registry") as reg:
        publisher = copy_store(publisher_template, tmp_path / "publisher")
        key, _ = ed25519_key(tmp_path / "ci.pem", 1)
        publish(cli, publisher, f"{reg.host}/{REPOSITORY}:{TAG}", key, 1, "a1@0.5")
        log = (reg.storage.parent / "registry.log").read_text()
    puts = re.findall(rf'"PUT /v2/{REPOSITORY}/manifests/(\S+) HTTP', log)
    assert len(puts) >= 3 and puts[-1] == TAG and puts.count(TAG) == 1, puts  # manifest, referrer, index, tag
