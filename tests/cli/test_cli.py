"""The command line as a user meets it: help, usage errors, and the generated reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import one_line

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_is_up_to_date():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_cli_docs.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


VERBS = {"init", "import", "ls", "show", "run", "activate", "deactivate", "rollback", "status", "log",
         "fsck", "gc", "verify", "serve", "chat", "export", "push", "pull", "sign", "tag", "rm", "mv", "health", "follow"}


def test_help_lists_exactly_the_verbs(cli):
    """Each verb as the first word of a row of the command table (not a substring: 'log' must
    not be found inside 'reflog'), and no verb the list does not know."""
    import re

    r = cli("--help")
    assert r.code == 0
    commands = r.out[r.out.index("Commands"):]
    listed = set(re.findall(r"^\W+([a-z]+)\s{2,}\S", commands, re.M))
    assert listed == VERBS
    for verb in sorted(VERBS):
        assert cli(verb, "--help").code == 0, verb


def test_a_verb_is_parsed_by_an_app_of_that_verb_alone(cli, monkeypatch):
    """`run` builds only the invoked verb's command (slm.cli.app_for: typer would otherwise
    build every command's parameters at each start-up); what a verb says, its help and its
    usage errors, is word for word what the whole app says."""
    import slm.cli
    import typer.main

    for verb in sorted(VERBS):
        narrow = slm.cli.app_for(["--store", "somewhere", verb, "--json"])
        assert set(typer.main.get_command(narrow).commands) == {verb}
    for argv in ([], ["--help"], ["-h"], ["frobnicate"], ["--store", "x"], ["--store=x", "--bogus", "ls"]):
        assert slm.cli.app_for(argv) is slm.cli.app, argv
    asked = [[verb, "--help"] for verb in sorted(VERBS)] + [
        ["activate", "--no-such-option"], ["--store=elsewhere", "rollback", "-n", "x"], ["import", "adapter"],
        ["import", "frobnicate"], ["show"]]
    narrow_said = [cli(*argv) for argv in asked]
    monkeypatch.setattr(slm.cli, "app_for", lambda argv: slm.cli.app)
    whole_said = [cli(*argv) for argv in asked]
    for argv, narrow, whole in zip(asked, narrow_said, whole_said):
        assert (narrow.code, narrow.out, narrow.err) == (whole.code, whole.out, whole.err), argv
    assert {r.code for r in narrow_said} == {0, 2}


def test_unknown_command_is_a_usage_error(cli):
    r = cli("frobnicate")
    assert r.code == 2 and one_line(r.err)


def test_missing_argument_is_a_usage_error(cli):
    r = cli("import", "base")
    assert r.code == 2 and one_line(r.err)


def test_init_json_and_idempotence(cli, store_dir):
    first = cli("init", "--json")
    assert first.code == 0 and first.json() == {"store": str(store_dir), "created": True}
    again = cli("init", "--json")
    assert again.json()["created"] is False


def test_ls_on_empty_store(cli):
    cli("init")
    assert cli("ls", "--json").json() == []
    assert "empty" in cli("ls").out


def test_show_unknown_name(cli):
    cli("init")
    r = cli("show", "nothing")
    assert r.code == 3 and one_line(r.err)


@pytest.mark.parametrize("args,hint", [
    (("run", "hello"), "slm activate"), (("verify",), "name a composition or a base to verify"),
    (("export", "-o", "out"), "name a composition or a base"), (("push", "localhost:1/x:y"), "name a composition"),
])
def test_commands_on_the_active_composition_with_nothing_active(cli, store_dir, args, hint):
    """Every command that defaults to the active composition says so in one line (exit 3,
    compositions.active_id) and what to name instead; nothing is written."""
    cli("init")
    before = sorted(p.relative_to(store_dir) for p in store_dir.rglob("*"))
    r = cli(*args)
    assert r.code == 3 and one_line(r.err) and "nothing is active: " in r.err and hint in r.err, r.err
    assert sorted(p.relative_to(store_dir) for p in store_dir.rglob("*")) == before
