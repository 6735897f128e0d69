"""Names against races and forgeries: every check of a new name is made under the store lock by
the transaction that writes it (a tag and an import of one name, run together, never both take
it); a name that reads as a composition id or id prefix is refused wherever names are made; and
`slm fsck` finds, and `--repair` undoes, a name held by a base and a tag or a name file that
disagrees with its log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S, copy_store, lock_held_elsewhere, one_line, refused, tiny_store, wait_until
from slm.store import StoreDir

RACES = 6  # name pairs raced at once: on the old code each pair ended double-owned half the time


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("hostile-names")
    store = tiny_store(root, tiny_model, {"french": 1}, [("activate", "tq", "french")])
    return {"store": store, "lora": root / "lora1", "gguf": tiny_model["gguf_q"]}


@pytest.fixture
def store_dir(template, tmp_path, monkeypatch):
    path = copy_store(template["store"], tmp_path)
    monkeypatch.setenv("SLM_STORE", str(path))
    return path


def _slm(store_dir: Path, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "slm", "--store", str(store_dir), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _waiting_on(lock: Path, procs: list[subprocess.Popen]) -> bool:
    """Whether every process has the store's lock file open: each is past its checks made
    without the lock, polling for it (lock_held_elsewhere holds it)."""
    def has_open(pid: int) -> bool:
        try:
            return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(lock) for fd in os.listdir(f"/proc/{pid}/fd"))
        except (FileNotFoundError, ProcessLookupError):
            return False
    return all(p.poll() is None and has_open(p.pid) for p in procs)


@pytest.mark.hostile
@pytest.mark.slow
def test_a_tag_and_an_import_of_one_name_run_together_never_both_take_it(cli, store_dir, template):
    names = [f"race{i}" for i in range(RACES)]
    config = store_dir / "config.toml"  # they all wait for the lock held below
    config.write_text(config.read_text().replace("lock_timeout_s = 30.0", f"lock_timeout_s = {HANG_S}"))
    with lock_held_elsewhere(store_dir):
        pairs = [(_slm(store_dir, "tag", n, "tq+french"), _slm(store_dir, "import", "base", template["gguf"],
                                                             "--name", n)) for n in names]
        procs = [p for pair in pairs for p in pair]
        wait_until(lambda: _waiting_on(store_dir / "lock", procs) or any(p.poll() is not None for p in procs),
                   "every process waiting for the store lock")
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
    for name, (tagging, importing) in zip(names, pairs):
        results = [(p.wait(HANG_S), p.communicate()[1]) for p in (tagging, importing)]
        assert sorted(code for code, _ in results) == [0, 4], (name, results)
        err = next(err for code, err in results if code == 4)
        assert one_line(err) and f"{name!r} is already the name of" in err
    store = StoreDir.open(store_dir)
    for name in names:
        assert (store.names.get("tags", name) is None) != (store.names.get("bases", name) is None), name
        assert cli("rm", name).code == 0
    assert cli("fsck").code == 0


def _forge_tag_over_base(cli, store_dir: Path, base: str) -> str:
    """What the race left: a tag file (and its log) under a base's name. The composition id."""
    assert cli("tag", "forged", "tq+french@0.5").code == 0
    for folder in (store_dir / "names" / "tags", store_dir / "logs" / "names" / "tags"):
        (folder / "forged").rename(folder / base)
    return StoreDir.open(store_dir).names.get("tags", base)


@pytest.mark.hostile
def test_fsck_finds_and_repairs_a_name_held_by_a_base_and_a_tag(cli, store_dir):
    comp_id = _forge_tag_over_base(cli, store_dir, "tq")
    r = cli("fsck", "--json")
    assert r.code == 5
    assert [f["problem"] for f in r.json()["findings"]] == ["name-owned-twice"]
    repaired = cli("fsck", "--repair", "--json")
    assert repaired.code == 0, repaired.err
    assert "'tq-tag'" in repaired.json()["findings"][0]["action"]
    assert cli("fsck").code == 0
    store = StoreDir.open(store_dir)
    assert store.names.get("tags", "tq") is None and store.names.get("tags", "tq-tag") == comp_id
    assert cli("activate", "tq-tag", "--json").json()["active"]["id"] == comp_id
    assert cli("log", "tq", "--json").code == 0  # the base's history: the tag's left with it
    assert cli("mv", "tq", "tq2").code == 0 and cli("rm", "tq-tag").code == 0


@pytest.mark.hostile
@pytest.mark.parametrize("forgery", ["moved", "removed", "planted"])
def test_fsck_makes_a_name_follow_its_log(cli, store_dir, forgery):
    assert cli("tag", "prod", "tq+french@0.5").code == 0
    assert cli("tag", "other", "tq").code == 0
    store = StoreDir.open(store_dir)
    logged, elsewhere = store.names.get("tags", "prod"), store.names.get("tags", "other")
    if forgery == "moved":  # the name file says another composition than its log's last line
        (store_dir / "names" / "tags" / "prod").write_text(elsewhere + "\n")
    elif forgery == "removed":
        (store_dir / "names" / "tags" / "prod").unlink()
    else:  # a name the log says was removed
        assert cli("rm", "prod").code == 0
        (store_dir / "names" / "tags" / "prod").write_text(elsewhere + "\n")
        logged = None
    r = cli("fsck", "--json")
    assert r.code == 5 and [f["problem"] for f in r.json()["findings"]] == ["name-log-mismatch"]
    assert cli("fsck", "--repair").code == 0
    assert cli("fsck").code == 0
    assert StoreDir.open(store_dir).names.get("tags", "prod") == logged


ID_LIKE = ["e37c266a5aa7", "DEADBEEF", "0123456789"]


def _id_like_makers(template):
    """The commands that make a name, as a function of the name."""
    return {
        "import base": lambda name: ("import", "base", template["gguf"], "--name", name),
        "import adapter": lambda name: ("import", "adapter", template["lora"], "--name", name),
        "tag": lambda name: ("tag", name, "tq"),
        "mv": lambda name: ("mv", "french", name),
    }


@pytest.mark.hostile
@pytest.mark.parametrize("maker", ["import base", "import adapter", "tag", "mv"])
def test_a_name_that_reads_as_an_id_is_refused_wherever_names_are_made(cli, store_dir, template, maker):
    active = cli("status", "--json").json()["active"]["id"]
    make = _id_like_makers(template)[maker]
    for name in [active[7:19], *ID_LIKE]:
        r = refused(cli, store_dir, 4, *make(name))
        assert "as a composition id or digest prefix" in r.err, r.err
    assert cli("activate", active[7:19], "--json").json()["active"]["id"] == active
    for fine in ("cafe", "e37c266a5aaz", "v1e37c266a5aa7"):  # too short to be a prefix, or not all hex
        r = cli(*make(fine))
        assert r.code == 0, (fine, r.err)
        if maker == "mv":
            assert cli("mv", fine, "french").code == 0
