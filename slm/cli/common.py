"""What every command of the `slm` command line shares: the app, the global --store option,
the common options, opening the store, and showing a result (--json or the human printer).

No `from __future__ import annotations` in slm/cli: typer reads each parameter's annotation,
and string annotations cost it a compile and an eval each at every start-up."""

import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from slm import numbers, render
from slm.errors import SlmError

app = typer.Typer(
    name="slm",
    help="Keep a quantized LLM base immutable; switch adapters on and off as verifiable overlays.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
import_app = typer.Typer(help="Import a base model or an adapter into the store.", no_args_is_help=True)
app.add_typer(import_app, name="import")

JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON on stdout.")

# Numeric options are read with slm.numbers' grammar (ASCII decimal), not click's int() /
# float(), which take "1_0" as 10 and Arabic-Indic digits: text outside it is a usage error.
integer, decimal = numbers.option_integer, numbers.option_decimal
MemoryBudgetOpt = typer.Option(
    None, "--memory-budget", metavar="SIZE",
    help="Refuse if the estimated peak memory exceeds SIZE (e.g. 512M, 2G); "
         "default: memory_budget in the store's config.toml, else no limit.",
)

ExactOpt = typer.Option(
    False, "--exact",
    help="Compute every product in float32 (within 1e-3 of transformers; what `slm verify` "
         "checks). Default: integer products over int8-rounded activations where the C kernels "
         "have them, as llama.cpp does: faster, logits move (docs/numerics.md).")

InsecureOpt = typer.Option(False, "--insecure", help="Allow plain HTTP to a registry that is not on loopback.")


@app.callback(invoke_without_command=True)
def _global(
    ctx: typer.Context,
    store: Optional[Path] = typer.Option(
        None, "--store", metavar="DIR",
        help="The store directory (default: $SLM_STORE, else .slm found upward from here).",
    ),
    version: bool = typer.Option(
        False, "--version",
        help="Print slm's version, the runtime version and the kernels' build (the SIMD level they "
             "were compiled for), then exit; with --json as JSON."),
    json_out: bool = typer.Option(False, "--json", hidden=True),  # (slm --version --json)
) -> None:
    ctx.obj = {"store": store}
    if version:
        import slm

        show_result(slm.version_info(), json_out, render.version)
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:  # options but no command (`slm --store DIR`), as without --version
        ctx.fail("Missing command.")


def hand_ctrl_c_to_the_command() -> None:
    """The command is about to open the store: from here Ctrl-C raises KeyboardInterrupt, so that
    what it begins unwinds (slm/entry.py). Another program's handler is left alone."""
    entry = sys.modules.get("slm.entry")
    if entry is not None and signal.getsignal(signal.SIGINT) is entry.exit_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def open_store(ctx: typer.Context, check_config: bool = True):
    """The public API's Store (imported when a command runs: `slm --help` stays fast)."""
    from slm.api import Store

    hand_ctrl_c_to_the_command()
    return Store.open(ctx.obj["store"], check_config)


class Reported(Exception):
    """An error whose result is already on stdout as the one --json document."""

    def __init__(self, err: SlmError):
        super().__init__(str(err))
        self.err = err


def show_result(result, json_out: bool, printer) -> None:
    """--json prints the result's JSON form; otherwise the human printer. Then the result's
    own verdict, if it has one (`check()`: a failed verify, a run stopped by a switch, an
    unclean fsck), decides the exit code."""
    if json_out:
        render.print_json(result.to_json() if hasattr(result, "to_json") else result)
    else:
        printer(result)
    verdict = getattr(result, "check", None)
    if verdict is None:
        return
    try:
        verdict()
    except SlmError as err:
        if json_out:
            raise Reported(err) from err
        raise


def progress_bar(json_out: bool):
    return render.BarProgress(enabled=False if json_out else None)
