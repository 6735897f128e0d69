"""Store and API details an attack found loose: a forged reflog line makes gc report damage
(exit 5, pointing at fsck), a composition manifest with a key slm does not know is refused, and
the public API answers a wrong argument (a wrong type, an unknown keyword, a Runtime that
could keep nothing staged) with an SlmError, as the command line answers a bad option."""

from __future__ import annotations

from pathlib import Path

import pytest

import slm
from helpers import copy_store, one_line, refused, tiny_store
from slm.errors import InvalidInput, UsageError
from slm.store import StoreDir


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("store-api")
    return tiny_store(root, tiny_model, {"french": 1}, [("activate", "tq", "french@0.5")])


@pytest.fixture
def store_dir(template, tmp_path, monkeypatch):
    path = copy_store(template, tmp_path)
    monkeypatch.setenv("SLM_STORE", str(path))
    return path


@pytest.mark.hostile
def test_gc_on_a_forged_reflog_line_reports_damage_and_points_at_fsck(cli, store_dir):
    StoreDir.open(store_dir).reflog.append(None, "blake3:" + "ab" * 32, "activate")  # a well-formed line
    r = refused(cli, store_dir, 5, "gc")
    assert "slm fsck" in r.err
    assert cli("gc", "--dry-run").code == 5


@pytest.mark.hostile
@pytest.mark.parametrize("where", ["top", "runtime", "adapter", "provenance"])
def test_a_composition_manifest_with_an_unknown_key_is_refused(cli, store_dir, tmp_path, where):
    import tomllib

    import tomlkit

    store = StoreDir.open(store_dir)
    comp_id = cli("status", "--json").json()["active"]["id"]
    doc = tomllib.loads(store.objects.read_verified(store.names.get("compositions", comp_id[7:])).decode())
    manifest = tmp_path / "m.toml"
    manifest.write_text(tomlkit.dumps(doc))
    assert cli("activate", "-f", manifest).code == 0  # the record as stored is a manifest activate takes
    table = {"top": doc, "runtime": doc["runtime"], "adapter": doc["adapters"][0], "provenance": doc["provenance"]}
    table[where]["run_hook"] = "rm -rf /"
    manifest.write_text(tomlkit.dumps(doc))
    r = refused(cli, store_dir, 4, "activate", "-f", manifest)
    assert "unknown key 'run_hook'" in r.err


def _calls(store: slm.Store, tmp_path: Path) -> dict:
    comp = store.composition("tq+french")
    return {
        "tag(123, spec)": lambda: store.tag(123, "tq"),
        "rm(None)": lambda: store.rm(None),
        "mv(1, 2)": lambda: store.mv(1, 2),
        "name_log(b'x')": lambda: store.name_log(b"x"),
        "session(123)": lambda: slm.Runtime(store).session(123),
        "compose(adapters='french')": lambda: store.compose("tq", "french"),
        "Runtime('store')": lambda: slm.Runtime(str(store.root)),
        "Runtime(max_staged=0)": lambda: slm.Runtime(store, max_staged=0),
        "Runtime(max_staged=-1)": lambda: slm.Runtime(store, max_staged=-1),
        "Runtime(max_staged=True)": lambda: slm.Runtime(store, max_staged=True),
        "status(verbose=True)": lambda: store.status(verbose=True),
        "activate(comp, budget='1G')": lambda: store.activate(comp, budget="1G"),
        "Store.open(path, 1, 2)": lambda: slm.Store.open(store.root, True, 2),
        "export(comp) of an unstored composition": lambda: store.export(comp, tmp_path / "out"),
    }


EXPECTED = {"status(verbose=True)": UsageError, "activate(comp, budget='1G')": UsageError,
            "Store.open(path, 1, 2)": UsageError, "export(comp) of an unstored composition": slm.errors.NotFound}


@pytest.mark.hostile
def test_the_api_answers_a_wrong_argument_with_an_slm_error(store_dir, tmp_path):
    store = slm.Store.open(store_dir)
    before = sorted(p.relative_to(store_dir) for p in store_dir.rglob("*") if "cache" not in p.parts)
    for call, run in _calls(store, tmp_path).items():
        with pytest.raises(EXPECTED.get(call, InvalidInput)) as caught:
            run()
        assert one_line(str(caught.value)), (call, caught.value)
    assert sorted(p.relative_to(store_dir) for p in store_dir.rglob("*") if "cache" not in p.parts) == before


def test_export_takes_a_stored_composition_as_the_other_verbs_do(store_dir, tmp_path):
    store = slm.Store.open(store_dir)
    active = store.active()
    assert store.export(active, tmp_path / "out").composition_id == active.id
