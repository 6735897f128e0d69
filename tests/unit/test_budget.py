"""The memory budget: estimates, refusals that change nothing, and the config default."""

from __future__ import annotations

import pytest

from helpers import one_line, snapshot
from slm.compose.memory import parse_size
from slm.errors import InvalidInput


def test_parse_size():
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert parse_size("1000") == 1000
    with pytest.raises(InvalidInput):
        parse_size("lots")


@pytest.fixture
def tiny(cli, store, tiny_model):
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("import", "base", tiny_model["hf"], "--name", "th").code == 0
    assert cli("activate", "tq").code == 0
    return store


def test_over_budget_activation_is_refused_before_anything_changes(cli, tiny, store_dir):
    before = snapshot(store_dir)
    r = cli("activate", "th", "--memory-budget", "10M")
    assert r.code == 8 and one_line(r.err) and "MiB" in r.err
    assert snapshot(store_dir) == before
    ok = cli("activate", "th", "--memory-budget", "1G", "--json")
    assert ok.code == 0 and ok.json()["memory_estimate"]["total"] < 1 << 30


def test_run_honours_the_budget_and_the_config_default(cli, tiny, store_dir):
    r = cli("run", "hello", "-n", "2", "--memory-budget", "10M")
    assert r.code == 8 and one_line(r.err)
    config = store_dir / "config.toml"
    config.write_text(config.read_text().replace("[defaults]\n", '[defaults]\nmemory_budget = "10M"\n'))
    assert cli("run", "hello", "-n", "2").code == 8
    assert cli("activate", "th").code == 8
    assert cli("run", "hello", "-n", "2", "--memory-budget", "2G").code == 0, "the flag wins"
