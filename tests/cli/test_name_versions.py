"""Versions of a name (NAME@{N}, from its reflog), the names shown beside compositions in
`slm ls`, `status` and `log`, and `slm rm` of a name something uses (exit 19 without --force)."""

from __future__ import annotations

import json

import pytest

from helpers import copy_store, refused, tiny_store


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """tq; french imported twice (v1 seed 1, then v2 seed 3); pirate; prod tagged tq+pirate,
    then tq+french@0.8 (so prod@{1} is tq+pirate); tq+french@0.8 active."""
    import make_random_lora

    from slm.cli import run

    root = tmp_path_factory.mktemp("versions")
    store = tiny_store(root, tiny_model, {"french": 1, "pirate": 2},
                       [("tag", "prod", "tq+pirate"), ("tag", "prod", "tq+french@0.8"),
                        ("activate", "tq", "french@0.8")])
    make_random_lora.make_random_lora(root / "lora3", seed=3, rank=4, hidden=64, intermediate=128,
                                      layers=2, kv_dim=32)
    assert run(["--store", str(store), "import", "adapter", str(root / "lora3"), "--name", "french"]) == 0
    return {"store": store}


@pytest.fixture
def store_dir(template, tmp_path, monkeypatch):
    path = copy_store(template["store"], tmp_path)
    monkeypatch.setenv("SLM_STORE", str(path))
    return path


def _json(cli, *args):
    r = cli(*args, "--json")
    assert r.code == 0, (args, r.err)
    return json.loads(r.out)


def _id(cli, spec):
    return _json(cli, "show", spec)["id"]


def test_a_tag_version_names_its_previous_target_in_every_verb(cli, store_dir):
    before, now = _id(cli, "tq+pirate"), _id(cli, "tq+french@{1}@0.8")
    assert _id(cli, "prod@{1}") == before and _id(cli, "prod@{0}") == _id(cli, "prod") == now
    assert _json(cli, "tag", "prod", "prod@{1}")["new"] == before  # the issue's `slm tag prod prod@{1}`
    assert _id(cli, "prod") == before and _id(cli, "prod@{1}") == now
    assert _json(cli, "rollback", "--to", "prod@{1}")["active"]["id"] == now
    assert _json(cli, "activate", "prod@{2}")["active"]["id"] == before


def test_an_adapter_version_composes_with_its_old_digest(cli, store_dir):
    log = _json(cli, "log", "french")
    v1, v2 = log[1]["new"], log[0]["new"]
    assert v1 != v2
    composed = _id(cli, "tq+french@{1}@0.8")
    assert composed != _id(cli, "tq+french@0.8") == _id(cli, "tq+french@{0}@0.8")
    # the composition active since before the re-import is that version
    active = _json(cli, "status")["active"]
    assert active["id"] == composed and [a["digest"] for a in active["adapters"]] == [v1]
    assert _json(cli, "show", "french@{1}")["digest"] == v1


def test_a_version_past_the_log_is_not_found_and_says_how_many_entries(cli, store_dir):
    r = refused(cli, store_dir, 3, "show", "prod@{2}")
    assert "the log of tag 'prod' has 2 entries" in r.err
    r = refused(cli, store_dir, 3, "activate", "tq+french@{5}")
    assert "the log of adapter 'french' has 2 entries" in r.err


@pytest.mark.parametrize("spec", ["prod@{x}", "prod@{-1}", "prod@{1234567890}", "prod@{}", "prod@{١}",
                                  "tq+french@{x}@0.8", "@active~x", "@active~-1", "@active~1234567890"])
def test_a_malformed_version_is_invalid_input(cli, store_dir, spec):
    r = refused(cli, store_dir, 4, "activate", spec)
    assert "whole number" in r.err or "NAME@{N}" in r.err


def test_a_removed_names_versions_stay_reachable_through_its_log(cli, store_dir):
    assert cli("rm", "prod").code == 0
    refused(cli, store_dir, 3, "show", "prod@{0}")
    assert _id(cli, "prod@{1}") == _id(cli, "tq+french@{1}@0.8")


def test_ls_status_and_log_show_the_names_of_each_composition(cli, store_dir):
    now, before = _id(cli, "prod"), _id(cli, "prod@{1}")
    assert cli("tag", "stable", "prod@{1}").code == 0
    rows = {e["digest"]: e for e in _json(cli, "ls") if e["kind"] == "composition"}
    assert rows[now]["names"] == ["prod"] and rows[before]["names"] == ["prod@{1}", "stable"]
    assert rows[now]["spec"] == "tq+french@{1}@0.8" and rows[before]["spec"] == "tq+pirate"
    adapters = {e["name"]: e for e in _json(cli, "ls") if e["kind"] == "adapter"}
    assert adapters["french"]["names"] == ["french"]
    status = _json(cli, "status")
    assert status["names"] == ["prod"] and status["spec"] == "tq+french@{1}@0.8"
    log = _json(cli, "log")
    assert log[0]["new"] == now and log[0]["names"] == ["prod"]
    versions = _json(cli, "log", "prod")
    assert [e["names"] for e in versions] == [["prod"], ["prod@{1}", "stable"]]
    text = cli("ls").out
    assert "prod@{1}, stable" in text and "tq+french@{1}@0.8" in text
    assert "prod" in cli("log").out


def test_rm_of_a_name_in_use_needs_force(cli, store_dir):
    r = refused(cli, store_dir, 19, "rm", "tq")
    assert "the active composition" in r.err and "--force" in r.err
    assert cli("tag", "stable", "tq+pirate").code == 0
    r = refused(cli, store_dir, 19, "rm", "pirate")
    assert "tag 'stable'" in r.err
    assert cli("rm", "french").code == 0  # its current version (v2) is in nothing: free to go
    assert cli("rm", "--force", "tq").code == 0
    assert cli("show", "tq").code == 3
    assert cli("run", "hello", "-n", "1").code == 0  # the active composition keeps its digests


def test_the_servers_model_field_takes_a_version(cli, store_dir):
    """A request's `model` is a spec like any other: prod@{1} is served, one past the log is
    404 (not found), a malformed one 400."""
    pytest.importorskip("uvicorn")
    from serve_helpers import Server

    before = _id(cli, "prod@{1}")
    server = Server(store_dir, "--threads", "1")
    try:
        body = {"prompt": "hello", "max_tokens": 2}
        status, headers, data = server.http("POST", "/v1/completions", {**body, "model": "prod@{1}"})
        assert status == 200 and headers["slm-composition"] == before, data[:300]
        assert server.http("POST", "/v1/completions", {**body, "model": "prod@{7}"})[0] == 404
        assert server.http("POST", "/v1/completions", {**body, "model": "prod@{x}"})[0] == 400
    finally:
        assert server.stop() == 0
