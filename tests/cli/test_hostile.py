"""The hostile-input suite (issue 11): every defect an outside attack found, and a sample of each
class of attack that held. Run alone with `pytest -m hostile`. This file: data loss through
--logits-out, failed commands that changed the store, hangs and unbounded work, Ctrl-C;
test_hostile_refusals.py: non-finite numbers, documented exit codes, terminal escapes and the
sample of attacks that held.

The promises checked: a command that fails changes nothing in the store (a snapshot compares
every file's mode and bytes), prints one line on stderr and exits with a documented code; the
recovery tool never hangs; nothing a user owns outside the store is destroyed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import blocked_reading_stdin, lock_held_elsewhere, one_line, refused, snapshot, wait_until
from hostile_fixtures import QUICK, SLM, fsck_clean, slm_proc, store_dir, template  # noqa: F401  (fixtures)
from slm.store import StoreDir
from slm.store import digest as dg

pytestmark = pytest.mark.hostile


# ------------------------------------------------------------------ data loss via --logits-out

def test_logits_out_never_writes_inside_the_store(cli, store_dir):
    blob = next((store_dir / "objects" / "blake3").iterdir())
    data = blob.read_bytes()
    r = refused(cli, store_dir, 4, "run", "-n", "2", "--logits-out", blob, "hello")
    assert "inside the store" in r.err
    assert blob.read_bytes() == data
    fsck_clean(cli, store_dir)


def test_a_failing_run_leaves_the_users_file_untouched(cli, store_dir, tmp_path):
    precious = tmp_path / "precious.npy"
    precious.write_bytes(b"the user's own data")
    # a run that fails after its checks: the prompt is past the context of the tiny model
    r = cli("--store", store_dir, "run", "-n", "1", "--logits-out", precious, "word " * 5000)
    assert r.code == 4 and one_line(r.err)
    assert precious.read_bytes() == b"the user's own data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.npy", "store"], "no temp file left"
    # a run that succeeds replaces it
    assert cli("--store", store_dir, "run", "-n", "2", "--logits-out", precious, "hello").code == 0
    assert np.load(precious).dtype == np.float32


def test_logits_out_to_an_unwritable_place_is_exit_12(cli, store_dir):
    refused(cli, store_dir, 12, "run", "-n", "1", "--logits-out", "/proc/version", "hello")
    refused(cli, store_dir, 12, "run", "-n", "1", "--logits-out", "/proc", "hello")


# ------------------------------------------------------- failed commands that changed the store

def test_ref_naming_a_missing_composition_is_refused_then_repaired(cli, store_dir):
    from slm.store.refs import encode_ref

    ghost = dg.of_bytes(b"no such composition")
    (store_dir / "refs" / "active").write_bytes(encode_ref(ghost))
    refused(cli, store_dir, 9, "activate", "tq")
    refused(cli, store_dir, 9, "rollback")
    refused(cli, store_dir, 9, "deactivate", "a2")
    assert cli("--store", store_dir, "fsck").code == 9
    assert cli("--store", store_dir, "fsck", "--repair").code == 0
    fsck_clean(cli, store_dir)
    assert cli("--store", store_dir, "gc").code == 0
    assert cli("--store", store_dir, "activate", "tq").code == 0
    fsck_clean(cli, store_dir)


def test_torn_reflog_tail_is_refused_before_anything_is_written(cli, store_dir):
    with open(store_dir / "logs" / "active", "ab") as f:
        f.write(b"5 junk")
    refused(cli, store_dir, 9, "activate", "tq", "a1", "a2")
    assert not list((store_dir / "journal").iterdir())
    assert cli("--store", store_dir, "fsck", "--repair").code == 0
    fsck_clean(cli, store_dir)
    assert cli("--store", store_dir, "activate", "tq", "a1", "a2").code == 0


def test_damaged_middle_reflog_line_is_refused_then_rebuilt(cli, store_dir):
    log = store_dir / "logs" / "active"
    lines = log.read_bytes().split(b"\n")
    before = StoreDir.open(store_dir).reflog.entries()
    lines[1] = lines[1][:-3] + b"xyz"  # entry 2's checksum no longer matches
    log.write_bytes(b"\n".join(lines))
    refused(cli, store_dir, 5, "activate", "tq", "a1", "a2")
    refused(cli, store_dir, 5, "rollback")
    assert cli("--store", store_dir, "fsck").code == 5
    assert cli("--store", store_dir, "fsck", "--repair").code == 0
    fsck_clean(cli, store_dir)
    after = StoreDir.open(store_dir).reflog.entries()
    # the chain of ids restores the damaged line's transition exactly; only its op is unknown
    assert [(e.old, e.new) for e in after] == [(e.old, e.new) for e in before]
    assert cli("--store", store_dir, "gc").code == 0
    assert cli("--store", store_dir, "rollback").code == 0
    fsck_clean(cli, store_dir)


# ---------------------------------------------------------------------- hangs, unbounded work

@pytest.mark.parametrize("where", ["target_modules", "rank_pattern"])
def test_catastrophic_backtracking_pattern_is_refused_quickly(template, store_dir, tmp_path, where):
    adapter = tmp_path / "evil"
    shutil.copytree(template["root"] / "lora1", adapter)
    config_path = adapter / "adapter_config.json"
    config = json.loads(config_path.read_text())
    evil = "(.+)+" + "(a|aa)+" * 4 + "z"
    if where == "target_modules":
        config["target_modules"] = evil
    else:
        config["rank_pattern"] = {evil: 4}
    config_path.write_text(json.dumps(config))
    before = snapshot(store_dir)
    r = slm_proc(store_dir, "import", "adapter", adapter, "--name", "evil")  # a hang raises TimeoutExpired
    if where == "target_modules":  # the pattern selects no module: refused, store unchanged
        assert r.returncode == 4 and one_line(r.stderr.decode()), r.stderr
        assert snapshot(store_dir) == before
    else:  # a rank_pattern key that matches nothing is harmless once it cannot hang
        assert r.returncode == 0, r.stderr


def test_a_pattern_that_backtracks_forever_is_cut_by_the_timeout():
    from slm.errors import InvalidInput
    from slm.formats import patterns

    # ~10^12 steps without the cut: only the per-match timeout raises this error
    with pytest.raises(InvalidInput, match="too long to match"):
        patterns.fullmatch(r"(a|aa)+$", "a" * 60 + "b")


def _plant(path: Path, kind: str) -> None:
    """Replace a store file by a FIFO, a directory, a symlink or garbage."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
        (path / "inner").write_text("x")
    elif kind == "symlink":
        path.symlink_to("/etc/passwd")
    else:
        path.write_bytes(b"\x00\xff garbage \x1b]0;pwn\x07\n" * 3)


STORE_FILES = {
    "ref": lambda s: s / "refs" / "active",
    "reflog": lambda s: s / "logs" / "active",
    "intent": lambda s: s / "journal" / "active.intent",
    "name": lambda s: s / "names" / "adapters" / "a1",
    "composition-record": lambda s: next((s / "names" / "compositions").iterdir()),
    "config": lambda s: s / "config.toml",
}
# fsck --repair rebuilds these; a damaged name or config needs the operator (exit 5)
REPAIRABLE = {"ref", "reflog", "intent"}


@pytest.mark.parametrize("kind", ["fifo", "dir", "symlink", "garbage"])
@pytest.mark.parametrize("which", sorted(STORE_FILES))
def test_recovery_tools_never_hang_on_a_replaced_store_file(store_dir, which, kind):
    target = STORE_FILES[which](store_dir)
    _plant(target, kind)
    for args in (["status"], ["fsck"], ["fsck", "--repair"], ["fsck"]):
        r = slm_proc(store_dir, *args, timeout=QUICK)  # a hang raises TimeoutExpired
        err = r.stderr.decode()
        assert "Traceback" not in err and b"\x1b" not in r.stdout + r.stderr, (args, err)
        assert r.returncode in (0, 5, 9), (args, r.returncode, err)
    if which in REPAIRABLE:
        assert r.returncode == 0, f"second fsck after --repair: {r.stdout.decode()}"
        assert slm_proc(store_dir, "activate", "tq", "a1").returncode == 0
    else:  # damage that needs the operator is reported, not hidden
        assert r.returncode == 5


def test_thousands_of_copies_of_one_adapter_are_refused_before_the_lock(cli, store_dir, tmp_path):
    store = StoreDir.open(store_dir)
    manifest = (store_dir / "names" / "adapters" / "a1").read_text().strip()
    comp = store.objects.read_verified(store.names.get("compositions", dg.hex_of(store.active_ref.read())))
    text = comp.decode().split("[[adapters]]")[0]
    def copies(n):
        return "".join(f'[[adapters]]\nname = "a1"\ndigest = "{manifest}"\nload_order = {i}\nweight = 1.0\n'
                       for i in range(1, n + 1))
    path = tmp_path / "many.toml"
    # refused before the lock: another process holding it does not delay the refusals (taking
    # it would wait lock_timeout_s and exit 7); the messages say which early check refused
    with lock_held_elsewhere(store_dir):
        path.write_text(text + copies(10_000))
        assert "more than a composition manifest can be (1048576)" in refused(cli, store_dir, 4, "activate", "-f",
                                                                             path).err
        path.write_text(text + copies(1_000))
        assert "at most 64" in refused(cli, store_dir, 6, "activate", "-f", path).err
    dup = text + "".join(f'[[adapters]]\nname = "a1"\ndigest = "{manifest}"\nload_order = {i}\nweight = 1.0\n'
                         for i in (1, 2))
    path.write_text(dup)
    assert "twice" in refused(cli, store_dir, 6, "activate", "-f", path).err
    assert "twice" in refused(cli, store_dir, 6, "activate", "tq", "a1", "a1").err


# ----------------------------------------------------------------------------------- tracebacks

def test_garbage_fault_spec_is_a_usage_error(store_dir):
    r = slm_proc(store_dir, "status", env={"SLM_FAULTS": "garbage"})
    assert r.returncode == 2 and one_line(r.stderr.decode()), r.stderr


@pytest.mark.parametrize("module", ["typer", "numpy", "rich.console"])
def test_ctrl_c_during_start_up_says_interrupted(store_dir, module):
    """Ctrl-C while the CLI's own imports run, made deterministic: the import of `module`
    raises KeyboardInterrupt exactly as a signal arriving then would."""
    code = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def hooked(name, *a, **k):\n"
        f"    if name == {module!r}: raise KeyboardInterrupt\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = hooked\n"
        f"sys.argv = ['slm', '--store', {str(store_dir)!r}, 'run', 'hello']\n"
        "from slm.entry import main\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=QUICK)
    assert r.returncode == 130 and r.stderr.decode() == "slm: interrupted\n", r.stderr


def test_ctrl_c_while_a_command_works_says_interrupted(store_dir):
    """`run -` waits for its prompt on a pipe that stays open: the signal is sent once the
    process is seen blocked in read(0) (/proc), not after a guessed delay. stdin is closed only
    after it exits: a swallowed Ctrl-C is a hang here, not an empty prompt (exit 4)."""
    p = subprocess.Popen([*SLM, "--store", str(store_dir), "run", "-"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: blocked_reading_stdin(p.pid), "read of the prompt", proc=p)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=QUICK)
    finally:
        if p.poll() is None:
            p.kill()
    out, err = p.communicate(timeout=QUICK)
    assert p.returncode == 130 and err.decode() == "slm: interrupted\n", err
