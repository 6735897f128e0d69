"""`slm gc`: the plan, the retention policy, and that nothing reachable is removed."""

from __future__ import annotations

from helpers import forget_name, snapshot
from slm.store import StoreDir
from slm.store import digest as dg


def _orphan(store_dir, payload=b"left behind by an interrupted import") -> str:
    store = StoreDir.open(store_dir)
    staging = store.objects.staging()
    digest = staging.put(payload)
    staging.commit()
    return digest


def test_gc_removes_only_the_unreachable(cli, store, store_dir, tiny_model):
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("import", "base", tiny_model["hf"], "--name", "th").code == 0
    assert cli("activate", "tq").code == 0
    assert cli("activate", "th").code == 0
    orphan = _orphan(store_dir)
    stray_record = "f" * 64
    StoreDir.open(store_dir).names.set("compositions", stray_record, orphan)

    before = snapshot(store_dir)
    dry = cli("gc", "--dry-run", "--json").json()
    assert snapshot(store_dir) == before, "a dry run removes nothing"
    assert [b["digest"] for b in dry["blobs"]] == [orphan]
    assert dry["composition_records"] == [stray_record]

    done = cli("gc", "--json").json()
    assert not done["dry_run"]
    assert not (store_dir / "objects" / "blake3" / dg.hex_of(orphan)).exists()
    assert cli("fsck").code == 0
    # everything in the reflog can still be rolled back to and run
    assert cli("rollback", "--json").json()["active"]["base_name"] == "tq"
    assert cli("run", "hello", "-n", "2").code == 0
    again = cli("gc", "--json").json()
    assert again["blobs"] == [] and again["composition_records"] == []


def test_gc_keeps_unnamed_bases_of_logged_compositions(cli, store, store_dir, tiny_model):
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("activate", "tq").code == 0
    forget_name(store_dir, "bases", "tq")
    assert cli("gc", "--json").json()["blobs"] == []
    assert cli("run", "hello", "-n", "2").code == 0
