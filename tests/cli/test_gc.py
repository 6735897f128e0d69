"""`slm gc`: the plan, the retention policy, and that nothing reachable is removed."""

from __future__ import annotations

import pytest

from helpers import copy_store, forget_name, refused, snapshot
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


DAY = 86400.0
START = 1_800_000_000.0


class _Clock:
    """time.time() as the reflogs and gc see it: set by the test, so a year passes in seconds."""

    def __init__(self, now: float = START):
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    from slm.ops.store import gc
    from slm.store import reflog

    fake = _Clock()
    monkeypatch.setattr(reflog, "time", fake)
    monkeypatch.setattr(gc, "time", fake)
    return fake


def _adapter_blobs(store: StoreDir, name: str) -> set[str]:
    """An adapter's manifest and tensor blobs (the first target its name's log records)."""
    from slm.compose.adapter_manifest import parse_adapter_manifest

    digest = store.names.log("adapters", name).entries()[0].new
    return {digest} | set(parse_adapter_manifest(store.objects.read_verified(digest)).blob_digests())


@pytest.fixture(scope="module")
def twenty(tmp_path_factory, tiny_model):
    """A store with tq and 20 tiny adapters a0..a19 (the LoRAs, imported by each test at its
    own clock)."""
    import make_random_lora

    from slm.cli import run

    root = tmp_path_factory.mktemp("retention")
    loras = [make_random_lora.make_random_lora(root / f"lora{i}", seed=i + 1, rank=2, hidden=64,
                                               intermediate=128, layers=2, kv_dim=32) for i in range(20)]
    store = root / "store"
    assert run(["--store", str(store), "init"]) == 0
    assert run(["--store", str(store), "import", "base", str(tiny_model["gguf_q"]), "--name", "tq"]) == 0
    return store, loras


def test_a_year_of_daily_switches_among_20_adapters_keeps_only_what_the_policy_or_a_name_reaches(
        twenty, tmp_path, clock):
    """The issue's device: 400 switches, one a day, among 20 adapters (each one's turn 20 days,
    then `slm rm`), one of them tagged; the default retention (the newest 100 entries, or 90
    days). gc frees every adapter older than the policy, and keeps the rollback window's (the
    kept entries and the composition the oldest came from), the tagged one and the named one."""
    import slm

    store_dir = copy_store(twenty[0], tmp_path)
    api = slm.Store.open(store_dir)
    for i, lora in enumerate(twenty[1]):
        clock.now = START + (20 * i - 0.5) * DAY
        api.import_adapter(lora, f"a{i}")
    store = StoreDir.open(store_dir)
    blobs = {f"a{i}": _adapter_blobs(store, f"a{i}") for i in range(20)}
    for k in range(400):
        i = k // 20
        clock.now = START + k * DAY
        api.activate(f"tq+a{i}@{1 if k % 2 == 0 else 0.5}")
        if k == 100:
            api.tag("pinned", "@active")  # tq+a5
        if k % 20 == 0 and i > 0:  # the previous adapter's turn is over
            clock.now += DAY / 2
            prev = f"a{i - 1}"
            if prev == "a5":
                with pytest.raises(slm.InUse):
                    api.rm(prev)
            api.rm(prev, force=prev == "a5")
    clock.now = START + 400 * DAY
    before = len(list(store.objects.digests()))
    assert api.gc(dry_run=True).active_log_expired == 300

    done = api.gc()
    kept = {f"a{i}" for i in (5, 14, 15, 16, 17, 18, 19)}  # tagged; the rollback window; named
    freed = set(blobs) - kept
    left = set(store.objects.digests())
    assert all(blobs[a] <= left for a in kept)
    assert all(not blobs[a] & left for a in freed)
    assert done.active_log_expired == 300 and len(api.log()) == 100
    adapter_blobs = sum(len(blobs[a]) for a in freed)
    print(f"\n400 switches among 20 adapters, default retention: logs/active 400 -> 100 entries; "
          f"{len(done.blobs)} of {before} blobs freed ({done.bytes} bytes): {len(freed)} adapters "
          f"({adapter_blobs} blobs) and {len(done.composition_records)} composition records; "
          f"kept {sorted(kept)}")
    assert len(done.blobs) == adapter_blobs + len(done.composition_records)
    assert api.fsck().exit_code == 0
    # the whole window is reachable: 100 steps back is tq+a14@0.5, one more is past the log
    assert api.rollback(100).active.adapters[0].name == "a14"
    assert api.composition("pinned").adapters[0].name == "a5"
    with pytest.raises(slm.InvalidInput):
        api.rollback(102)


def test_retention_keeps_the_newest_entries_and_what_they_name(twenty, tmp_path, clock, cli):
    store_dir = copy_store(twenty[0], tmp_path)
    s = ["--store", store_dir]
    for i in range(3):
        assert cli(*s, "import", "adapter", twenty[1][i], "--name", f"a{i}").code == 0
    for k, spec in enumerate(["tq", "tq+a0", "tq+a1", "tq+a2", "tq"]):
        clock.now = START + k * DAY
        assert cli(*s, "activate", spec).code == 0
    assert cli(*s, "rm", "a0").code == 0 and cli(*s, "rm", "a1").code == 0
    assert cli(*s, "gc", "--prune-now", "--json").json()["active_log_expired"] == 0  # all young: kept
    store = StoreDir.open(store_dir)
    a0, a1 = _adapter_blobs(store, "a0"), _adapter_blobs(store, "a1")
    before = snapshot(store_dir)
    dry = cli(*s, "gc", "--prune-now", "--keep-active", "2", "--expire-active", "now", "--dry-run", "--json").json()
    assert dry["active_log_expired"] == 3 and snapshot(store_dir) == before
    done = cli(*s, "gc", "--prune-now", "--keep-active", "2", "--expire-active", "now", "--json").json()
    assert (done["active_log_expired"], done["active_log_keep"], done["active_log_expiry_s"]) == (3, 2, 0)
    log = cli(*s, "log", "--json").json()
    assert [e["seq"] for e in log] == [2, 1] and log[-1]["old"] is not None  # tq+a1 -> tq+a2 -> tq
    left = {"blake3:" + p.name for p in (store_dir / "objects" / "blake3").iterdir()}
    assert a1 <= left, "tq+a1 is the oldest kept entry's old composition: rollback -n 2 reaches it"
    assert not a0 & left
    assert cli(*s, "fsck").code == 0
    assert cli(*s, "rollback", "-n", "2", "--json").json()["active"]["adapters"][0]["name"] == "a1"
    assert cli(*s, "gc", "--keep-active", "0", "--expire-active", "now", "--json").json()["active_log_expired"] == 2
    assert len(cli(*s, "log", "--json").json()) == 1, "the active composition's entry always stays"
    assert cli(*s, "fsck").code == 0 and cli(*s, "status").code == 0


def test_retention_comes_from_config_and_bad_values_are_refused(twenty, tmp_path, clock, cli):
    store_dir = copy_store(twenty[0], tmp_path)
    s = ["--store", store_dir]
    assert cli(*s, "import", "adapter", twenty[1][0], "--name", "a0").code == 0
    for k, spec in enumerate(["tq", "tq+a0", "tq", "tq+a0@0.5"]):
        clock.now = START + k * DAY
        assert cli(*s, "activate", spec).code == 0
    clock.now = START + 10 * DAY
    config = store_dir / "config.toml"
    config.write_text(config.read_text() + '\n[gc]\nactive_log_keep = 1\nactive_log_expiry = "2d"\n')
    assert cli(*s, "gc", "--dry-run", "--json").json()["active_log_expired"] == 3
    assert cli(*s, "gc", "--dry-run", "--expire-active", "8.5d", "--json").json()["active_log_expired"] == 2
    assert cli(*s, "gc", "--dry-run", "--keep-active", "3", "--json").json()["active_log_expired"] == 1
    for args, code in ((("--keep-active", "-1"), 4), (("--keep-active", "x"), 2), (("--expire-active", "soon"), 4)):
        refused(cli, store_dir, code, "gc", *args)
    config.write_text(config.read_text().replace("active_log_keep = 1", 'active_log_keep = "all"'))
    r = refused(cli, store_dir, 4, "gc")
    assert "gc.active_log_keep" in r.err
