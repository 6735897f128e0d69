"""Hostile operators and peers on the machine against `slm follow`'s state (docs/fleet.md):
follow/state.json, follow/lock and cache/follow-status.json replaced or filled with hostile
values, bad arguments. No registry is reached: what is refused is refused before the network
(a registry on a closed loopback port stands for one that is down).

The promises checked: `slm follow --status` never hangs, never crashes and never prints a raw
control character or a line the files forged; a refused command prints one line, exits with
its documented code and changes nothing in the store."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import tomlkit

from helpers import one_line, snapshot

pytestmark = pytest.mark.hostile

KEY = "ed25519:" + "A" * 43 + "="
COMP = "blake3:" + "1" * 64
MANIFEST = "sha256:" + "2" * 64


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store(cli, tmp_path) -> Path:
    root = tmp_path / "device"
    assert cli("--store", root, "init").code == 0
    return root


@pytest.fixture
def trusting(store) -> Path:
    doc = tomlkit.parse((store / "config.toml").read_text())
    doc["trusted_keys"] = [KEY]
    (store / "config.toml").write_text(tomlkit.dumps(doc))
    return store


@pytest.fixture
def down() -> str:
    """A tag on a registry that does not answer."""
    return f"127.0.0.1:{_closed_port()}/fleet/support:prod"


def _state(reference="127.0.0.1:5000/fleet/support:prod", good=None, trial=None, bad=()) -> dict:
    return {"schema": "slm.follow/1", "reference": reference, "good": good, "trial": trial, "bad": list(bad)}


def _good(**over) -> dict:
    return {"composition": COMP, "manifest": MANIFEST, "version": 3, **over}


def _bad(**over) -> dict:
    return {**_good(), "reason": "the script:x check failed", "time": 1.0, **over}


def _write_state(store: Path, doc: dict) -> None:
    (store / "follow").mkdir(exist_ok=True)
    (store / "follow" / "state.json").write_text(json.dumps(doc))


def refused(cli, store: Path, code: int, *args):
    """The command fails with `code` and one line, the store unchanged but for the follower's
    advisory report (which says what the round heard)."""
    def files():
        return {k: v for k, v in snapshot(store).items() if k != "cache/follow-status.json"}

    before = files()
    r = cli("--store", store, *args)
    assert r.code == code, (args, r.code, r.err)
    assert one_line(r.err) and "internal error" not in r.err, r.err
    assert files() == before, f"{args} changed the store"
    return r


def _no_raw_controls(text: str) -> bool:
    return not any(ord(c) < 32 and c != "\n" or c == "\x7f" for c in text)


# ------------------------------------------------------------------ cache/follow-status.json

@pytest.mark.parametrize("content", [
    "[" * 15000,  # nesting deeper than the JSON reader recurses
    '{"reference": ' + "[" * 15000,
])
def test_a_deeply_nested_status_report_is_ignored(cli, store, content):
    (store / "cache" / "follow-status.json").write_text(content)
    r = cli("--store", store, "follow", "--status")
    assert r.code == 0, r.err
    assert "follows no tag" in r.out


def test_status_report_text_cannot_forge_lines_or_drive_the_terminal(cli, store):
    reference = "127.0.0.1:5000/fleet/support:prod"
    _write_state(store, _state(reference, good=_good()))
    forged = "down\n  good:    version 99 blake3:evil\x1b[2J\x07"
    (store / "cache" / "follow-status.json").write_text(json.dumps({
        "reference": reference, "last_check": "2026-01-01T00:00:00Z\n  trial: version 98", "last_outcome": "error",
        "last_error": forged, "last_exit_code": 12, "next_try": "soon\x1b]0;title\x07", "failures": 2}))
    r = cli("--store", store, "follow", "--status")
    assert r.code == 0, r.err
    assert _no_raw_controls(r.out), r.out
    lines = [ln.strip() for ln in r.out.splitlines()]
    assert [ln for ln in lines if ln.startswith(("good:", "trial:"))] == [f"good:    version 3 {COMP[7:19]}"], r.out
    assert "version 99" in r.out and "version 98" in r.out  # shown, within the lines they came in


# ------------------------------------------------------------------------ follow/state.json

@pytest.mark.parametrize("doc", [pytest.param(doc, id=name) for name, doc in {
    "version-2**60": _state(good=_good(version=1 << 60)),  # above every statement's version: the device frozen
    "manifest-escape": _state(good=_good(manifest="sha256:\x1b[2J")),
    "manifest-newline": _state(good=_good(manifest="sha256:" + "2" * 64 + "\n  trial: forged")),
    "time-inf": _state(bad=[_bad(time=float("inf"))]),
    "time-bool": _state(bad=[_bad(time=True)]),
    "reason-5000": _state(bad=[_bad(reason="r" * 5000)]),
    "deaths-2**62": _state(trial={**_good(), "previous": None, "deaths": 1 << 62, "failed": None}),
    "reference-escape": _state(reference="not a reference\x1b[2J"),
    "reference-digest": _state(reference="127.0.0.1:5000/fleet/support@sha256:" + "2" * 64),
}.items()])
def test_hostile_values_in_the_state_are_damage(cli, store, doc):
    _write_state(store, doc)
    text = json.dumps(doc)
    (store / "follow" / "state.json").write_text(text.replace("Infinity", "1e999"))
    r = refused(cli, store, 5, "follow", "--status")
    assert "slm fsck" in r.err and _no_raw_controls(r.err)
    report = cli("--store", store, "fsck", "--json")
    assert report.code != 0 and "follow-state" in report.out


def test_state_reasons_print_on_one_line(cli, store):
    _write_state(store, _state(good=_good(), bad=[_bad(reason="x\n  good:    version 99 forged\x1b[31m")]))
    r = cli("--store", store, "follow", "--status")
    assert r.code == 0, r.err
    assert _no_raw_controls(r.out), r.out
    assert [ln.split()[0] for ln in r.out.splitlines()[1:]] == ["active:", "good:", "bad:"], r.out


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "huge"])
def test_a_state_file_that_is_not_one_is_damage_and_nothing_waits(cli, store, tmp_path, kind):
    path = store / "follow" / "state.json"
    path.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "elsewhere.json").write_text(json.dumps(_state()))
        path.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as f:
            f.truncate(1 << 30)
    r = cli("--store", store, "follow", "--status")  # (no snapshot: it would read the FIFO)
    assert r.code == 5 and one_line(r.err) and "slm fsck" in r.err, r.err
    report = cli("--store", store, "fsck", "--json")
    assert report.code != 0 and "follow-state" in report.out


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_a_status_report_that_is_not_a_file_is_ignored_and_left_alone(cli, store, tmp_path, kind):
    path = store / "cache" / "follow-status.json"
    target = tmp_path / "victim"
    target.write_text("precious")
    {"fifo": lambda: os.mkfifo(path), "directory": path.mkdir, "symlink": lambda: path.symlink_to(target)}[kind]()
    r = cli("--store", store, "follow", "--status")
    assert r.code == 0 and "follows no tag" in r.out, r.err
    assert target.read_text() == "precious"


# ------------------------------------------------------------------------------- arguments

@pytest.mark.parametrize("interval", ["0", "-1", "nan", "NaN", "inf", "1e308", "1_0", "0.5s", "8d", "9" * 400,
                                      "1 0", "٣", "", "30x"])
def test_interval_bombs_are_exit_4(cli, trusting, down, interval):
    r = refused(cli, trusting, 4, "follow", down, "--interval", interval)
    assert "--interval" in r.err


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "1e308"])
def test_timeout_bombs_are_exit_4_before_the_registry_is_asked(cli, trusting, down, timeout):
    r = refused(cli, trusting, 4, "follow", down, "--once", "--timeout", timeout)
    assert "--timeout" in r.err


@pytest.mark.parametrize("ref", ["127.0.0.1:5000/fleet/support@sha256:" + "2" * 64, "bad host!/x:y", "",
                                 "127.0.0.1:5000/Fleet:prod", "127.0.0.1:5000/" + "x" * 5000 + ":t"])
def test_references_that_are_no_tag_are_exit_4(cli, trusting, ref):
    refused(cli, trusting, 4, "follow", ref, "--once")


def test_a_store_without_trusted_keys_is_refused_before_anything(cli, store, down):
    """No key to believe a statement under is the operator's mistake, not a round's outcome: no
    lock taken, no report written, no loop that retries it forever."""
    import threading

    import slm
    from slm.errors import Incompatible

    before = snapshot(store)
    r = cli("--store", store, "follow", down, "--once")
    assert r.code == 6 and one_line(r.err) and "trusted_keys" in r.err, r.err
    rounds, stop = [], threading.Event()

    def on_round(result, error):
        rounds.append(error)
        stop.set()

    with pytest.raises(Incompatible, match="trusted_keys"):
        slm.Store.open(store).follow(down, interval="1s", on_round=on_round, stop=stop)
    assert rounds == [] and snapshot(store) == before


def test_a_fresh_device_whose_registry_is_down_shows_it_in_status(cli, trusting, down):
    assert cli("--store", trusting, "follow", down, "--once").code == 12
    status = cli("--store", trusting, "follow", "--status", "--json").json()
    assert status["reference"] == down and status["last_exit_code"] == 12 and status["last_error"]
    human = cli("--store", trusting, "follow", "--status")
    assert f"following {down}" in human.out and "exit 12" in human.out


def test_following_another_tag_is_refused(cli, trusting):
    _write_state(trusting, _state("127.0.0.1:5000/fleet/support:prod", good=_good()))
    r = refused(cli, trusting, 4, "follow", f"127.0.0.1:{_closed_port()}/fleet/support:canary", "--once")
    assert "--forget" in r.err


def test_a_store_lock_planted_as_a_symlink_creates_nothing_elsewhere(cli, store, tmp_path):
    """A peer on the machine that plants the store's lock -> a path of its choice gets no file
    made there by slm (which may run as another user): refused as damage, one line."""
    _write_state(store, _state(good=_good(), bad=[_bad()]))
    victim = tmp_path / "victim"
    (store / "lock").unlink(missing_ok=True)
    (store / "lock").symlink_to(victim)
    r = cli("--store", store, "follow", "--clear-bad")
    assert r.code == 12 and one_line(r.err) and "internal error" not in r.err, r.err
    assert not os.path.lexists(victim)


def test_clear_bad_takes_the_digests_status_shows_and_refuses_one_it_does_not_know(cli, store):
    """--status shows a bad mark's composition and manifest by their beginnings: --clear-bad
    --digest takes those; on the base it took only the whole digest, and answered 'cleared 0'
    (exit 0) to what the operator copied from --status, leaving the mark in place."""
    other = {"composition": "blake3:" + "3" * 64, "manifest": "sha256:" + "4" * 64}
    _write_state(store, _state(good=_good(), bad=[_bad(), _bad(**other)]))
    shown = cli("--store", store, "follow", "--status").out
    short = COMP[7:19]
    assert f"version 3 {short} {MANIFEST[:19]}" in shown
    r = refused(cli, store, 3, "follow", "--clear-bad", "--digest", "blake3:" + "9" * 64)
    assert "--status" in r.err
    refused(cli, store, 3, "follow", "--clear-bad", "--digest", "3333")  # too short to name one
    assert cli("--store", store, "follow", "--clear-bad", "--digest", short, "--json").json() == {"cleared": 1}
    assert cli("--store", store, "follow", "--clear-bad", "--digest", other["manifest"][:19],
               "--json").json() == {"cleared": 1}
    assert json.loads((store / "follow" / "state.json").read_text())["bad"] == []
