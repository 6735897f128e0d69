"""health.d scripts (slm.ops.infer.health_scripts.run_script) against scripts that misbehave with
their processes: real processes, bounded waits, nothing left running."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from helpers import wait_until
from slm.ops.infer.health_scripts import run_script

DEADLINE_S = 20.0  # far above what any script here needs when it is handled right
LONG_S = 600  # a sleep that outlives every wait of the test (wait_until gives up well before)


def _script(folder: Path, body: str) -> Path:
    path = folder / "check"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _pid(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


def _kill(pid: int | None) -> None:
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.hostile
def test_a_script_that_exits_leaving_a_child_on_its_stdout_is_judged_when_it_exits(tmp_path):
    """The script's verdict is its exit; a child it left holding its stdout open is killed then,
    not waited on until the deadline (which would fail a passing script, and late)."""
    child = tmp_path / "child.pid"
    path = _script(tmp_path, f"sleep {LONG_S} &\necho $! > {child}\necho fine >&2\nexit 0\n")
    try:
        passed, reason = run_script(path, dict(os.environ), tmp_path, DEADLINE_S)
        assert (passed, reason) == (True, "fine")
        wait_until(lambda: not _alive(_pid(child)), "the script's child killed when the script exited")
    finally:
        _kill(_pid(child))
