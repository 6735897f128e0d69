"""deploy/systemd/*.service, the units docs/fleet.md installs: each is a unit systemd accepts
(systemd-analyze verify, where it is installed), its ExecStart an slm command line slm's own
parser accepts that follows a tag (`slm follow REF` or `slm serve --follow REF`) on a store
under the unit's StateDirectory, run by a dedicated user, restarted always, its health.d
scripts killed with it (KillMode=control-group), with a stop timeout over the server's grace,
and no `slm fsck --repair` before it starts (which would roll back a pending trial: the boot
count defeated)."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from test_deploy_manifests import errors, parse_slm

UNITS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "systemd").glob("*.service"))


def _unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # systemd's keys are case-sensitive
    unit.read_string(path.read_text())
    return unit


def _seconds(value: str) -> float:
    """A systemd time span as these units write it: 30s, 2m."""
    return float(value[:-1]) * {"s": 1, "m": 60}[value[-1]]


def _follower(argv: list[str]):
    """The parsed command of an ExecStart after the slm binary, and the REF it follows."""
    ctx = parse_slm(argv)
    if ctx.command.name == "follow":
        return ctx, ctx.params["reference"]
    assert ctx.command.name == "serve", argv
    return ctx, ctx.params["follow"]


def test_there_is_a_unit_for_the_follower_and_one_for_the_server():
    assert [p.name for p in UNITS] == ["slm-follow.service", "slm-serve-follow.service"]


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_each_unit_runs_a_follower_as_docs_fleet_says(path):
    service = _unit(path)["Service"]
    exe, *argv = shlex.split(service["ExecStart"])
    assert Path(exe).name == "slm"
    ctx, reference = _follower(argv)
    assert reference and ":" in reference.rsplit("/", 1)[1], reference  # a tag, not a digest
    assert str(ctx.parent.params["store"]).startswith(f"/var/lib/{service['StateDirectory']}/")
    assert service["Restart"] == "always" and service["KillMode"] == "control-group"
    assert service["User"] not in ("", "root") and service["Group"] == service["User"]
    assert set(service["RestartPreventExitStatus"].split()) == {"2", "4"}
    assert "fsck" not in service.get("ExecStartPre", "")
    if ctx.command.name == "serve":
        assert _seconds(service["TimeoutStopSec"]) > ctx.params["grace"]


@pytest.mark.parametrize("planted, error", [
    (["--bogus-flag"], errors.NoSuchOption),
    (["--follow-interval"], errors.BadOptionUsage),
])
def test_the_checker_catches_a_bad_command_line(planted, error):
    exe, *argv = shlex.split(_unit(UNITS[1])["Service"]["ExecStart"])
    with pytest.raises(error):
        _follower([*argv, *planted])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_each_unit(tmp_path):
    for path in UNITS:  # (verify wants ExecStart's binary to exist: any will do)
        (tmp_path / path.name).write_text(path.read_text().replace("/usr/local/bin/slm", shutil.which("true")))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", *(str(tmp_path / p.name) for p in UNITS)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
