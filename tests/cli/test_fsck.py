"""`slm fsck`: what it finds, and what --repair restores."""

from __future__ import annotations

import os

import pytest

from helpers import one_line


@pytest.fixture
def active_store(cli, store, tiny_model):
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("import", "base", tiny_model["hf"], "--name", "th").code == 0
    assert cli("activate", "tq").code == 0
    assert cli("activate", "th").code == 0
    return store


def test_clean_store(cli, active_store):
    r = cli("fsck", "--json")
    assert r.code == 0 and r.json()["clean"] and r.json()["blobs_checked"] > 40


def _flip_byte(path, offset=None):
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))
    os.chmod(path, 0o444)


def test_flipped_byte_in_any_blob_is_caught(cli, active_store, store_dir):
    blobs = sorted((store_dir / "objects" / "blake3").iterdir())
    for blob in blobs[:: max(1, len(blobs) // 8)]:  # a spread of tensors, tokenizers, manifests
        original = blob.read_bytes()
        _flip_byte(blob)
        r = cli("fsck", "--json")
        assert r.code == 5, blob.name
        assert any(f["problem"] == "corrupt-blob" for f in r.json()["findings"])
        os.chmod(blob, 0o644)
        blob.write_bytes(original)
        os.chmod(blob, 0o444)
    assert cli("fsck").code == 0


def test_activating_a_composition_on_a_corrupt_blob_is_refused(cli, active_store, store_dir):
    shown = cli("show", "tq", "--json").json()
    blob = store_dir / "objects" / "blake3" / shown["tensors"][5]["digest"][7:]
    _flip_byte(blob)
    before = (store_dir / "refs" / "active").read_bytes()
    r = cli("activate", "tq")
    assert r.code == 5 and one_line(r.err)
    assert (store_dir / "refs" / "active").read_bytes() == before
    r = cli("run", "hi", "--base", "tq", "-n", "1")
    assert r.code == 5


def test_repair_quarantines_corrupt_blob_and_reimport_restores(cli, active_store, store_dir, tiny_model):
    shown = cli("show", "tq", "--json").json()
    blob = store_dir / "objects" / "blake3" / shown["tensors"][3]["digest"][7:]
    _flip_byte(blob)
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 5
    repaired = cli("fsck", "--repair", "--json").json()
    assert (store_dir / "lost+found" / blob.name).exists()
    assert repaired["unresolved"] >= 1, "the base now misses a blob: reported, not hidden"
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("fsck").code == 0


def test_torn_reflog_and_stale_ref_are_repaired(cli, active_store, store_dir):
    log_before = (store_dir / "logs" / "active").read_bytes()
    status = cli("status", "--json").json()["active"]["id"]
    with open(store_dir / "logs" / "active", "ab") as f:
        f.write(b"3 blake3:0123")
    r = cli("fsck", "--json")
    assert r.code == 9 and [f["problem"] for f in r.json()["findings"]] == ["torn-reflog"]
    assert cli("fsck", "--repair").code == 0
    assert (store_dir / "logs" / "active").read_bytes() == log_before
    assert cli("fsck").code == 0
    assert cli("status", "--json").json()["active"]["id"] == status


def test_crash_between_reflog_and_ref_rolls_forward(cli, active_store, store_dir):
    """Simulate: intent written, reflog line appended, then a crash before refs/active moved."""
    from slm.store import StoreDir

    store = StoreDir.open(store_dir)
    old = store.active_ref.read()
    target = [e for e in store.reflog.entries()][0].new  # the tq composition
    store.journal.begin("active", "activate", old, target)
    store.reflog.append(old, target, "activate")
    r = cli("fsck", "--json")
    assert r.code == 9
    assert {f["problem"] for f in r.json()["findings"]} == {"ref-mismatch", "interrupted"}
    assert cli("activate", "tq").code == 9, "commands refuse until repaired"
    assert cli("fsck", "--repair").code == 0
    assert store.active_ref.read() == target
    assert cli("fsck").code == 0


def test_junk_is_removed(cli, active_store, store_dir):
    (store_dir / "tmp" / ".stage.1.abc.tmp").mkdir()
    (store_dir / "refs" / ".active.1.abc.tmp").write_text("half")
    r = cli("fsck", "--json")
    assert r.code == 9 and len(r.json()["findings"]) == 2
    assert cli("fsck", "--repair").code == 0
    assert cli("fsck").code == 0


def test_interrupted_import_is_finished_by_repair(cli, store, store_dir, tiny_model):
    import subprocess
    import sys

    from slm.store.testing.faults import CRASH_EXIT_CODE

    env = {**os.environ, "SLM_FAULTS": "crash@point=import.before-name"}
    r = subprocess.run([sys.executable, "-m", "slm", "--store", str(store_dir), "import", "base",
                        str(tiny_model["gguf_q"]), "--name", "tq"], env=env, capture_output=True)
    assert r.returncode == CRASH_EXIT_CODE
    assert cli("ls", "--json").json() == [], "not named yet"
    report = cli("fsck", "--json")
    assert report.code == 9 and "interrupted import" in report.json()["findings"][0]["what"]
    assert cli("fsck", "--repair").code == 0
    assert [e["name"] for e in cli("ls", "--json").json()] == ["tq"]
    assert cli("run", "hello", "--base", "tq", "-n", "2").code == 0


@pytest.mark.hostile
def test_an_intent_of_an_unknown_kind_is_reported_not_guessed_at(cli, store, store_dir):
    """Only the kind that wrote an intent knows how to finish or undo it: fsck used to treat any
    intent it did not recognise as an interrupted switch and undo it. Now it reports it, leaves
    it (and everything else) as it is, and exits 5: the operator decides."""
    from helpers import snapshot
    from slm.store import digest as dg

    store.journal.begin("rebase-main", "rebase", None, dg.of_bytes(b"what a newer slm was doing"))
    before = snapshot(store_dir)
    for args in (("fsck", "--json"), ("fsck", "--repair", "--json")):
        r = cli(*args)
        assert r.code == 5, (args, r.err)
        [finding] = r.json()["findings"]
        assert finding["problem"] == "unknown-intent" and not finding["repairable"] and not finding["repaired"]
        assert "journal/rebase-main.intent" in finding["what"] and "'rebase'" in finding["what"]
    assert snapshot(store_dir) == before, "an intent nobody knows is left as it is"
    assert [i.name for i in store.journal.pending()] == ["rebase-main"]
    r = cli("fsck")
    assert r.code == 5 and "cannot be repaired from inside the store" in r.out
