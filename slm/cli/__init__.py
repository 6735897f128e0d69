"""The `slm` command line: parse, call one operation, render. No logic lives here.

    common.py      the app, the global --store option, shared options, opening the store,
                   showing a result
    store_cmds.py  init, import, activate, deactivate, rollback, status, log, fsck, gc,
                   verify, health, ls, show
    name_cmds.py   tag, rm, mv
    run_cmds.py    run, serve, chat
    ship_cmds.py   export, push, pull, sign
    follow_cmds.py follow
    (here)         running one command line: the exit code and the one error line

No `from __future__ import annotations` in slm/cli: typer reads each parameter's annotation,
and string annotations cost it a compile and an eval each at every start-up."""

import copy
import os
import sys

import typer

from slm import render
# Each module registers its commands on the app; imported in the order `slm --help` lists them.
from slm.cli import store_cmds  # noqa: F401, I001
from slm.cli import name_cmds  # noqa: F401, I001
from slm.cli import run_cmds  # noqa: F401, I001
from slm.cli import ship_cmds  # noqa: F401, I001
from slm.cli import follow_cmds  # noqa: F401, I001
from slm.cli.common import Reported, app, hand_ctrl_c_to_the_command  # noqa: F401 (the package's names)
from slm.errors import ExitCode, SlmError, printable
from slm.store.testing import faults


def _fail(code: int, message: str, as_json: bool) -> int:
    message = printable(" ".join(message.split()))  # one line, whatever an unexpected error carried
    if as_json:
        render.print_json({"error": message, "exit_code": int(code)})
    print(f"slm: error: {message}", file=sys.stderr)
    return int(code)


def _is_usage_error(err: Exception) -> bool:
    return any(c.__name__ == "UsageError" for c in type(err).__mro__) and hasattr(err, "format_message")


INTERRUPTED = 130


def interrupted() -> int:
    print("slm: interrupted", file=sys.stderr)
    return INTERRUPTED


def _invoked(argv: list[str]) -> str | None:
    """The verb `argv` names: its first word past the global option --store; None when an
    option comes first (--help, a mistake)."""
    i = 0
    while i < len(argv):
        if argv[i] == "--store":
            i += 2
        elif argv[i].startswith("--store="):
            i += 1
        else:
            return None if argv[i].startswith("-") else argv[i]
    return None


def app_for(argv: list[str]) -> typer.Typer:
    """The app with only the command `argv` invokes: typer builds the parameters of every
    command it holds from their signatures before it parses anything: start-up paid by every
    run for commands that do not run. The whole app when no known verb is named (`slm --help`, no
    verb, a misspelt one: their help and suggestions list every command)."""
    verb = _invoked(argv)
    commands = [c for c in app.registered_commands
                if (c.name or typer.main.get_command_name(c.callback.__name__)) == verb]
    groups = [g for g in app.registered_groups if g.name == verb]
    if not commands and not groups:
        return app
    narrow = copy.copy(app)
    narrow.registered_commands, narrow.registered_groups = commands, groups
    return narrow


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this; `main` exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    try:
        faults.install_from_env()
        result = app_for(argv)(args=argv, prog_name="slm", standalone_mode=False)
    except Reported as reported:  # stdout holds the result; the error line goes to stderr
        return _fail(reported.err.code, str(reported.err), as_json=False)
    except SlmError as err:
        return _fail(err.code, str(err), as_json)
    except typer.Exit as err:
        return int(err.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        return interrupted()
    except BrokenPipeError:
        return 0
    except OSError as err:  # the OS refused something no layer expected: still exit 12, one line
        if os.environ.get("SLM_DEBUG"):
            raise
        where = f" {err.filename}" if err.filename else ""
        return _fail(ExitCode.IO, f"cannot access{where}: {err.strerror or err}", as_json)
    except MemoryError as err:
        detail = f" ({err})" if str(err) else ""  # MemoryError() of a failed allocation says nothing
        return _fail(ExitCode.BUDGET, f"out of memory{detail}: the machine or this process's memory limit "
                                      "has no room for what the command needed", as_json)
    except RecursionError:  # a hostile file nested past what a parser can follow
        return _fail(ExitCode.INVALID_INPUT, "input is nested too deeply to read", as_json)
    except Exception as err:
        if _is_usage_error(err):  # typer vendors its own click; match by shape
            if type(err).__name__ == "NoArgsIsHelpError" and getattr(err, "ctx", None):
                print(err.ctx.get_help())
                return int(ExitCode.USAGE)
            return _fail(ExitCode.USAGE, " ".join(err.format_message().split()), as_json)
        if os.environ.get("SLM_DEBUG"):  # a bug: still one line; full trace with SLM_DEBUG=1
            raise
        return _fail(ExitCode.INTERNAL, f"internal error: {type(err).__name__}: {err} "
                     "(set SLM_DEBUG=1 for a traceback)", as_json)
    if result == INTERRUPTED:  # typer catches Ctrl-C and returns 130 (no command returns a value)
        return interrupted()
    return int(result or 0)


def main() -> None:
    sys.exit(run())  # slm.entry:main wraps this for Ctrl-C during start-up

