"""The object store, names and store discovery (no models involved)."""

from __future__ import annotations

import os
import stat

import blake3
import pytest

from slm.errors import IntegrityError, InvalidInput, NotFound
from slm.store import StoreDir, find_store, init_store
from slm.store import digest as dg
from slm.store.names import validate_name
from slm.store.store import SUBDIRS


def test_init_creates_layout_and_is_idempotent(store_dir):
    store, created = init_store(store_dir)
    assert created
    for sub in SUBDIRS:
        assert (store_dir / sub).is_dir()
    assert "format = 1" in (store_dir / "config.toml").read_text()
    again, created_again = init_store(store_dir)
    assert not created_again and again.root == store.root


def test_blob_name_is_its_blake3_and_mode_0444(store):
    staging = store.objects.staging()
    payload = os.urandom(3 << 20)
    digest = staging.put(payload)
    assert not store.objects.has(digest), "staged blobs are invisible until commit"
    assert staging.commit() == [digest]
    path = store.objects.path(digest)
    assert path.name == blake3.blake3(payload).hexdigest()
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert store.objects.read_verified(digest) == payload
    assert list((store.root / "tmp").iterdir()) == [], "staging area cleaned up"


def test_same_bytes_are_stored_once(store):
    first = store.objects.staging()
    d1 = first.put(b"same bytes")
    assert first.commit() == [d1]
    second = store.objects.staging()
    d2 = second.put(b"same bytes")
    assert d1 == d2
    assert second.commit() == [], "an existing blob is never rewritten"
    assert sum(1 for _ in store.objects.digests()) == 1


def test_discarded_staging_changes_nothing(store):
    staging = store.objects.staging()
    digest = staging.put(b"never committed")
    staging.discard()
    assert not store.objects.has(digest)
    assert list(store.objects.digests()) == []
    assert list((store.root / "tmp").iterdir()) == []


def test_existence_is_not_proof(store):
    staging = store.objects.staging()
    digest = staging.put(b"original bytes")
    staging.commit()
    path = store.objects.path(digest)
    os.chmod(path, 0o644)
    path.write_bytes(b"tampered bytes")
    assert store.objects.has(digest)
    assert not store.objects.verify(digest)
    with pytest.raises(IntegrityError):
        store.objects.read_verified(digest)
    # and a later import of the true bytes refuses to build on the corrupt blob
    with pytest.raises(IntegrityError):
        store.objects.staging().put(b"original bytes")


def test_symlinked_blob_is_refused(store, tmp_path):
    digest = dg.of_bytes(b"x")
    (store.root / "objects" / "blake3").mkdir(exist_ok=True)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x")
    store.objects.path(digest).symlink_to(target)
    with pytest.raises(IntegrityError):
        store.objects.read_verified(digest)


@pytest.mark.parametrize("bad", ["a/b", "..", "a..b", "", ".hidden", "x\ny", "tab\there",
                                 "back\\slash", "x" * 129, "nul\x00"])
def test_bad_names_are_rejected(bad):
    with pytest.raises(InvalidInput):
        validate_name(bad)


@pytest.mark.parametrize("good", ["smollm2", "SmolLM2-135M_Q4.1", "a", "x" * 128])
def test_good_names(good):
    assert validate_name(good) == good


def test_names_roundtrip(store):
    digest = dg.of_bytes(b"manifest")
    assert store.names.set("bases", "m", digest)
    assert not store.names.set("bases", "m", digest), "re-pointing to the same digest is a no-op"
    assert store.names.resolve("bases", "m") == digest
    assert store.names.items("bases") == [("m", digest)]
    with pytest.raises(NotFound):
        store.names.resolve("bases", "other")


def test_find_store_precedence(tmp_path, monkeypatch):
    a, _ = init_store(tmp_path / "a" / ".slm")
    b, _ = init_store(tmp_path / "b")
    nested = tmp_path / "a" / "x" / "y"
    nested.mkdir(parents=True)
    monkeypatch.delenv("SLM_STORE")
    assert find_store(None, cwd=nested) == a.root, "searched upward like git"
    monkeypatch.setenv("SLM_STORE", str(b.root))
    assert find_store(None, cwd=nested) == b.root, "the environment beats the search"
    assert find_store(str(a.root), cwd=nested) == a.root, "--store beats the environment"
    monkeypatch.delenv("SLM_STORE")
    with pytest.raises(NotFound):
        find_store(None, cwd=tmp_path)


def test_open_rejects_unknown_format(store):
    (store.root / "config.toml").write_text("format = 99\n")
    with pytest.raises(IntegrityError):
        StoreDir.open(store.root)


def test_digest_helpers():
    d = dg.of_bytes(b"abc")
    assert dg.is_digest(d) and d == dg.of_chunks([b"a", b"bc"])
    assert not dg.is_digest("blake3:" + "g" * 64)
    assert not dg.is_digest("sha256:" + "0" * 64)


def test_one_prefix_rule_for_digests_and_composition_ids(cli, tiny_model):
    """Abbreviated base digests and composition ids resolve by one rule (MIN_PREFIX hex digits,
    unique): `show` of a base and `rollback --to` of a composition accept the same lengths."""
    from slm.ops.store.resolve import MIN_PREFIX

    assert cli("init").code == 0
    base = cli("import", "base", tiny_model["gguf_q"], "--name", "tq", "--json").json()["digest"]
    comp = cli("activate", "tq", "--json").json()["active"]["id"]
    assert cli("activate", "tq", "--json").code == 0
    for digest, args in ((base, ["show"]), (comp, ["show"]), (comp, ["rollback", "--to"])):
        hex_id = digest.split(":")[1]
        short = cli(*args, hex_id[:MIN_PREFIX - 1])
        assert short.code == 3, (args, short.err)  # too short to be a prefix: not found
        assert cli(*args, hex_id[:MIN_PREFIX]).code == 0, args


@pytest.mark.parametrize("text", ["blake3:xyz", "sha256:" + "0" * 64, "blake3:" + "A" * 64, ""])
def test_a_malformed_digest_is_invalid_input_not_a_value_error(store, text):
    """dg.hex_of and Names.set raised plain ValueErrors (exit 1, the bug code)."""
    with pytest.raises(InvalidInput):
        dg.hex_of(text)
    with pytest.raises(InvalidInput):
        store.names.set("bases", "x", text)
    with pytest.raises(InvalidInput):
        store.names.get("no-such-kind", "x")
    assert store.names.get("bases", "x") is None


def test_the_store_lock_is_re_entrant_in_a_thread_and_exclusive_across_threads(store):
    """A verb that switches under its own lock takes it again (re-entrant); another thread of
    the same process (the server's) waits for it like another process."""
    import threading

    from slm.errors import Busy
    from slm.store.lock import store_lock

    outcome = []

    def other_thread():
        try:
            with store_lock(store.root / "lock", timeout=0.2):
                outcome.append("got it")
        except Busy:
            outcome.append("busy")

    with store.locked():
        with store.locked(timeout=0):  # re-entrant: no wait, no deadlock
            worker = threading.Thread(target=other_thread)
            worker.start()
            worker.join()
    assert outcome == ["busy"]
    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert outcome == ["busy", "got it"]


def test_an_intent_names_its_transaction_kind_and_key():
    """fsck dispatches on an intent's kind: the first word of its name, before the key that
    tells two transactions of that kind apart."""
    from slm.store.journal import Intent, intent_name

    new = dg.of_bytes(b"new")
    assert intent_name("active") == "active"
    assert intent_name("import", "base-my-model") == "import-base-my-model"
    intent = Intent("import-base-my-model", "import", None, new)
    assert (intent.kind, intent.key) == ("import", "base-my-model")
    alone = Intent("gc", "gc", None, new)
    assert (alone.kind, alone.key) == ("gc", "")
