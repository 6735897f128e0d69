"""A runtime-version bump (simulated): old compositions stay listed and inspectable, running one
is a one-line error naming the upgrade command, the upgrade builds a new verified composition,
and rolling back to a pre-upgrade id is refused the same way (docs/concepts.md)."""

from __future__ import annotations

import pytest

from helpers import one_line, snapshot, tiny_store
from slm.compose.composition import RUNTIME


@pytest.fixture
def old_store(cli, store_dir, tiny_model, tmp_path):
    tiny_store(tmp_path, tiny_model, 1, [("activate", "tq"), ("activate", "tq", "a1@0.5")], store=store_dir)
    return cli("status", "--json").json()["active"]["id"]


def test_a_version_bump_keeps_old_compositions_inspectable_and_upgrades_them(cli, store_dir, old_store,
                                                                              monkeypatch):
    old_id = old_store
    monkeypatch.setitem(RUNTIME, "version", "99.0.0")  # as if slm had been upgraded

    listed = cli("ls", "--json").json()
    assert old_id in {e["digest"] for e in listed if e["kind"] == "composition"}
    shown = cli("show", old_id, "--json")
    assert shown.code == 0 and 'version = "0.1.0"' in shown.json()["manifest_toml"]
    assert cli("log", "--json").json()[0]["new"] == old_id

    r = cli("run", "-n", "2", "hello")
    assert r.code == 6 and one_line(r.err) and "slm activate --upgrade" in r.err

    r = cli("activate", "--upgrade", "--json")
    assert r.code == 0, r.err
    new_id = r.json()["active"]["id"]
    assert new_id != old_id and r.json()["previous"] == old_id
    new_manifest = cli("show", new_id, "--json").json()["manifest_toml"]
    assert 'version = "99.0.0"' in new_manifest
    assert [a["weight"] for a in r.json()["active"]["adapters"]] == [0.5]
    assert cli("log", "--json").json()[0]["op"] == "upgrade"
    assert cli("verify").code == 0
    assert cli("run", "-n", "2", "hello").code == 0
    assert cli("activate", "--upgrade").code == 0  # again: nothing to do
    assert cli("status", "--json").json()["active"]["id"] == new_id

    before = snapshot(store_dir)
    r = cli("rollback")  # to the pre-upgrade id: refused, nothing changes
    assert r.code == 6 and one_line(r.err) and "--upgrade" in r.err
    assert snapshot(store_dir) == before
    r = cli("rollback", "-n", "2")  # the base alone under 0.1.0: also an old-runtime composition
    assert r.code == 6
    assert cli("fsck").code == 0
