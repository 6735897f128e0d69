"""Names are refs with a history (issue 32): an import under a taken name moves it, `slm tag`,
`slm rm`, `slm mv`, `slm log NAME`, gc's retention through names' reflogs (gc.reflog_expiry,
--prune-now), "did you mean" for a misspelt name, and a crash in the middle of a name move."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import copy_store, one_line, refused, snapshot, tiny_store
from slm.store import StoreDir
from slm.store.testing import faults


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """tq, french (v1, seed 1) and pirate (seed 2); tq+french active; loras for v2 and scratch."""
    import make_random_lora

    root = tmp_path_factory.mktemp("names")
    store = tiny_store(root, tiny_model, {"french": 1, "pirate": 2}, [("activate", "tq", "french")])
    for seed in (3, 4):
        make_random_lora.make_random_lora(root / f"lora{seed}", seed=seed, rank=4, hidden=64,
                                          intermediate=128, layers=2, kv_dim=32)
    return {"store": store, "v2": root / "lora3", "scratch": root / "lora4"}


@pytest.fixture
def store_dir(template, tmp_path, monkeypatch):
    path = copy_store(template["store"], tmp_path)
    monkeypatch.setenv("SLM_STORE", str(path))
    return path


def _json(cli, *args):
    r = cli(*args, "--json")
    assert r.code == 0, (args, r.err)
    return json.loads(r.out)


def _adapter_blobs(cli, name: str) -> set[str]:
    shown = _json(cli, "show", name)
    return {shown["digest"]} | {d for t in shown["targets"] for d in t["tensors"].values()}


def _objects(store_dir) -> set[str]:
    return {"blake3:" + p.name for p in (store_dir / "objects" / "blake3").iterdir()}


def test_import_under_a_taken_name_moves_it_and_says_what_moved(cli, template, store_dir):
    v1 = _json(cli, "show", "french")["digest"]
    r = cli("import", "adapter", template["v2"], "--name", "french")
    assert r.code == 0, r.err
    v2 = _json(cli, "show", "french")["digest"]
    assert v2 != v1
    assert f"french: {v1[7:19]} -> {v2[7:19]}" in r.out
    log = _json(cli, "log", "french")
    assert [(e["op"], e["old"], e["new"]) for e in log] == [("import", v1, v2), ("import", None, v1)]


def test_import_json_reports_the_previous_target(cli, template, store_dir):
    v1 = _json(cli, "show", "french")["digest"]
    moved = _json(cli, "import", "adapter", template["v2"], "--name", "french")
    assert moved["previous"] == v1 and moved["digest"] != v1
    again = _json(cli, "import", "adapter", template["v2"], "--name", "french")
    assert again["previous"] is None and again["digest"] == moved["digest"]  # the same bytes: nothing moved
    assert len(_json(cli, "log", "french")) == 2


def test_moving_a_name_leaves_the_active_composition_pinned_to_the_old_digest(cli, template, store_dir):
    v1 = _json(cli, "show", "french")["digest"]
    ref_before = (store_dir / "refs" / "active").read_bytes()
    assert cli("import", "adapter", template["v2"], "--name", "french").code == 0
    assert (store_dir / "refs" / "active").read_bytes() == ref_before
    active = _json(cli, "status")["active"]
    assert [a["digest"] for a in active["adapters"]] == [v1]


def test_gc_keeps_the_old_target_of_a_moved_name_until_its_log_entry_expires(cli, template, store_dir):
    assert cli("activate", "tq").code == 0
    v1_blobs = _adapter_blobs(cli, "french")
    assert cli("import", "adapter", template["v2"], "--name", "french").code == 0
    # v1 is in the active reflog (it was active): a name's expiry never drops that
    gc = _json(cli, "gc", "--prune-now")
    assert v1_blobs <= _objects(store_dir) and not {b["digest"] for b in gc["blobs"]} & v1_blobs


def test_rm_keeps_the_history_and_gc_prune_now_frees_exactly_the_unreachable_blobs(cli, template, store_dir):
    assert cli("import", "adapter", template["scratch"], "--name", "scratch").code == 0
    scratch = _adapter_blobs(cli, "scratch")
    digest = _json(cli, "show", "scratch")["digest"]
    before = _objects(store_dir)
    removed = _json(cli, "rm", "scratch")
    assert (removed["kind"], removed["old"], removed["new"], removed["moved"]) == ("adapter", digest, None, True)
    assert [e["op"] for e in _json(cli, "log", "scratch")] == ["rm", "import"]
    kept = _json(cli, "gc")  # its log entry is fresh (gc.reflog_expiry, 90 days): nothing goes
    assert kept["blobs"] == [] and _objects(store_dir) == before
    freed = _json(cli, "gc", "--prune-now")
    assert {b["digest"] for b in freed["blobs"]} == scratch
    assert _objects(store_dir) == before - scratch
    assert freed["bytes"] == sum(b["bytes"] for b in freed["blobs"]) > 0
    assert cli("fsck").code == 0


def test_gc_reflog_expiry_comes_from_config(cli, template, store_dir):
    assert cli("import", "adapter", template["scratch"], "--name", "scratch").code == 0
    scratch = _adapter_blobs(cli, "scratch")
    assert cli("rm", "scratch").code == 0
    with open(store_dir / "config.toml", "a") as f:
        f.write('\n[gc]\nreflog_expiry = "0s"\n')
    assert {b["digest"] for b in _json(cli, "gc")["blobs"]} == scratch


def test_a_bad_reflog_expiry_is_refused_by_gc(cli, store_dir):
    with open(store_dir / "config.toml", "a") as f:
        f.write('\n[gc]\nreflog_expiry = "soon"\n')
    r = refused(cli, store_dir, 4, "gc")
    assert "gc.reflog_expiry" in r.err


def test_tag_names_a_composition_and_retagging_moves_it(cli, store_dir):
    active_before = (store_dir / "refs" / "active").read_bytes()
    first = _json(cli, "tag", "prod", "tq+french@0.8")
    composed = _json(cli, "show", "tq+french@0.8")["id"]
    assert (first["kind"], first["old"], first["new"]) == ("tag", None, composed)
    assert (store_dir / "refs" / "active").read_bytes() == active_before  # tagging activates nothing
    second = _json(cli, "tag", "prod", "tq+pirate")
    assert (second["old"], second["new"]) == (composed, _json(cli, "show", "tq+pirate")["id"])
    assert [(e["old"], e["new"]) for e in _json(cli, "log", "prod")] == \
        [(composed, second["new"]), (None, composed)]
    assert _json(cli, "activate", "prod")["active"]["id"] == second["new"]
    assert _json(cli, "tag", "prod", "tq+pirate")["moved"] is False


def test_tag_validates_the_composition_and_changes_nothing_on_failure(cli, store_dir):
    r = refused(cli, store_dir, 3, "tag", "prod", "tq+frnch")
    assert "did you mean 'french'" in r.err
    refused(cli, store_dir, 4, "tag", "tq", "tq+french")  # a base's name is not free for a tag
    refused(cli, store_dir, 4, "tag", "../x", "tq")


def test_mv_renames_and_both_names_keep_their_history(cli, store_dir):
    digest = _json(cli, "show", "pirate")["digest"]
    moves = _json(cli, "mv", "pirate", "corsair")
    assert [(m["name"], m["old"], m["new"]) for m in moves] == [("corsair", None, digest), ("pirate", digest, None)]
    assert _json(cli, "show", "corsair")["digest"] == digest
    assert [e["op"] for e in _json(cli, "log", "pirate")] == ["mv-away", "import"]
    assert [e["op"] for e in _json(cli, "log", "corsair")] == ["mv"]
    refused(cli, store_dir, 3, "show", "pirate")
    refused(cli, store_dir, 4, "mv", "corsair", "french")  # taken


def test_log_alone_is_still_the_active_history(cli, store_dir):
    log = _json(cli, "log")
    assert [e["op"] for e in log] == ["activate"]
    assert log[0]["new"] == _json(cli, "status")["active"]["id"]


def test_deactivating_a_misspelt_adapter_fails_with_did_you_mean(cli, store_dir):
    r = refused(cli, store_dir, 3, "deactivate", "frnch")
    assert "did you mean 'french'" in r.err
    ok = cli("deactivate", "pirate")  # a real adapter that is not active: idempotent, exit 0
    assert ok.code == 0 and "is not active" in ok.out


def test_a_misspelt_spec_or_name_says_did_you_mean(cli, store_dir):
    assert cli("tag", "prod", "tq+french").code == 0
    for args in (("activate", "prd"), ("verify", "--no-numerics", "prd"), ("log", "prd"),
                 ("rm", "prd"), ("activate", "tq", "frnch")):
        r = refused(cli, store_dir, 3, *args)
        assert one_line(r.err) and ("did you mean 'prod'" in r.err or "did you mean 'french'" in r.err), r.err


@pytest.mark.parametrize("point,committed", [("name.after-log", True), ("reflog.before-append", False)])
def test_a_crash_in_a_tag_is_finished_or_undone_by_fsck(store_dir, point, committed, cli):
    """The name's reflog line is the commit point: a crash after it is finished by `slm fsck
    --repair` (the tag set), before it undone (no tag, no composition record left)."""
    before = snapshot(store_dir)
    env = {k: v for k, v in os.environ.items() if k != "SLM_FAULTS"}
    r = subprocess.run([sys.executable, "-m", "slm", "--store", str(store_dir), "tag", "prod", "tq+pirate@0.5"],
                       env={**env, "SLM_FAULTS": f"crash@point={point}"}, capture_output=True, timeout=300)
    assert r.returncode == faults.CRASH_EXIT_CODE, r.stderr
    assert cli("fsck").code == 9  # an interrupted transaction
    assert cli("tag", "other", "tq").code == 9  # nothing moves until it is repaired
    assert cli("fsck", "--repair").code == 0 and cli("fsck").code == 0
    store = StoreDir.open(store_dir)
    if committed:
        assert store.names.get("tags", "prod") == _json(cli, "show", "tq+pirate@0.5")["id"]
        assert [e.op for e in store.names.log("tags", "prod").entries()] == ["tag"]
    else:
        assert store.names.get("tags", "prod") is None
        after = snapshot(store_dir)
        assert {k for k in after if "compositions" in k} == {k for k in before if "compositions" in k}


def test_a_second_import_of_the_same_base_leaves_its_records_and_is_taken_back_whole(cli, tiny_model, store_dir, tmp_path):
    """The same GGUF under another path and name is the same base: its origin and GGUF frame
    records (SIDE_KINDS) keep the first import's, so `rm` and `gc --prune-now` of the second
    leave the store as it was (names' histories aside)."""
    tq = _json(cli, "show", "tq")["digest"]
    side = {p.relative_to(store_dir): p.read_bytes() for p in (store_dir / "names").rglob("*")
            if p.is_file() and p.parent.name in ("origins", "gguf")}
    assert side, "the first import recorded where the base came from"
    before = {k: v for k, v in snapshot(store_dir).items() if not k.startswith(("cache", "logs/names"))}
    copy = tmp_path / "elsewhere.gguf"
    copy.write_bytes(tiny_model["gguf_q"].read_bytes())
    assert cli("import", "base", copy, "--name", "again").code == 0
    assert _json(cli, "show", "again")["digest"] == tq
    assert {p: (store_dir / p).read_bytes() for p in side} == side
    assert cli("rm", "again").code == 0 and cli("gc", "--prune-now").code == 0
    after = {k: v for k, v in snapshot(store_dir).items() if not k.startswith(("cache", "logs/names"))}
    assert after == before
