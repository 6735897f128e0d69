"""The `slm` command line: parse, call one operation, render. No logic lives here.

No `from __future__ import annotations` here: typer reads each parameter's annotation, and
string annotations cost it a compile and an eval each at every start-up."""

import copy
import os
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from slm import numbers, render
from slm.errors import ExitCode, SlmError, printable
from slm.store.testing import faults

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
_integer, _decimal = numbers.option_integer, numbers.option_decimal
MemoryBudgetOpt = typer.Option(
    None, "--memory-budget", metavar="SIZE",
    help="Refuse if the estimated peak memory exceeds SIZE (e.g. 512M, 2G); "
         "default: memory_budget in the store's config.toml, else no limit.",
)


@app.callback()
def _global(
    ctx: typer.Context,
    store: Optional[Path] = typer.Option(
        None, "--store", metavar="DIR",
        help="The store directory (default: $SLM_STORE, else .slm found upward from here).",
    ),
) -> None:
    ctx.obj = {"store": store}


def hand_ctrl_c_to_the_command() -> None:
    """The command is about to open the store: from here Ctrl-C raises KeyboardInterrupt, so that
    what it begins unwinds (slm/entry.py). Another program's handler is left alone."""
    entry = sys.modules.get("slm.entry")
    if entry is not None and signal.getsignal(signal.SIGINT) is entry.exit_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _store(ctx: typer.Context, check_config: bool = True):
    """The public API's Store (imported when a command runs: `slm --help` stays fast)."""
    from slm.api import Store

    hand_ctrl_c_to_the_command()
    return Store.open(ctx.obj["store"], check_config)


class _Reported(Exception):
    """An error whose result is already on stdout as the one --json document."""

    def __init__(self, err: SlmError):
        super().__init__(str(err))
        self.err = err


def _show(result, json_out: bool, printer) -> None:
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
            raise _Reported(err) from err
        raise


def _progress(json_out: bool):
    return render.BarProgress(enabled=False if json_out else None)


@app.command()
def init(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """Create an empty store (./.slm, or --store / $SLM_STORE)."""
    from slm.api import Store

    hand_ctrl_c_to_the_command()
    store = Store.init(ctx.obj["store"])
    _show({"store": str(store.root), "created": store.created}, json_out, render.init_done)


@import_app.command("base")
def import_base(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="A .gguf file or a Hugging Face checkpoint directory."),
    name: str = typer.Option(..., "--name", "-n", help="Name for the base in the store."),
    quant: Optional[str] = typer.Option(
        None, "--quant", "-q",
        help="Hugging Face checkpoints only: q8_0 (default), q4_0, q4_1, q5_0, q5_1, q4_k, q6_k, "
             "q4_k_m (llama.cpp's Q4_K_M mix), nf4, f16 or f32.",
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Import a base model. GGUF tensors are kept byte for byte; HF weights are quantized."""
    _show(_store(ctx).import_base(path, name, quant, _progress(json_out)), json_out, render.import_summary)


@import_app.command("adapter")
def import_adapter(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="A PEFT adapter directory or a GGUF LoRA file."),
    name: str = typer.Option(..., "--name", "-n", help="Name for the adapter in the store."),
    base: Optional[str] = typer.Option(
        None, "--base", "-b", metavar="BASE",
        help="The stored base the adapter is for: its shapes are taken from it (not inferred "
             "from the adapter) and the adapter must fit it."),
    json_out: bool = JsonOpt,
) -> None:
    """Import a LoRA, IA3 or SHiRA adapter (PEFT), or a GGUF LoRA (llama.cpp)."""
    _show(_store(ctx).import_adapter(path, name, _progress(json_out), base), json_out, render.import_summary)


@import_app.command("bundle")
def import_bundle(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="An OCI image layout directory or .tar (slm export, skopeo copy oci:...)."),
    tag: Optional[str] = typer.Option(None, "--tag", help="Which manifest of the layout's index (its ref name)."),
    json_out: bool = JsonOpt,
) -> None:
    """Import a composition bundle: every blob re-hashed (sha256 and BLAKE3), one transaction."""
    from slm import render_dist

    _show(_store(ctx).import_bundle(path, tag, _progress(json_out)), json_out, render_dist.received)


@app.command()
def activate(
    ctx: typer.Context,
    base: Optional[str] = typer.Argument(
        None, help="The base (name or digest), or alone a stored composition id or 6+ hex prefix (a pulled one)."),
    adapters: Optional[list[str]] = typer.Argument(
        None, metavar="[ADAPTER[@WEIGHT]]...",
        help="Adapters in load order, each with an optional weight: a decimal number in ASCII digits "
             "(0.8, -0.5, .5, 1e-3; default 1)."),
    file: Optional[Path] = typer.Option(None, "-f", "--file", help="Activate a composition manifest (TOML)."),
    upgrade: bool = typer.Option(
        False, "--upgrade",
        help="Rebuild the active composition (or the one named instead of BASE) for this slm "
             "version, verify it against the oracle, and activate it."),
    memory_budget: Optional[str] = MemoryBudgetOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Validate a composition and make it the active one, atomically."""
    result = _store(ctx).activate(base, adapters or [], file=file, memory_budget=memory_budget,
                                  upgrade=upgrade)
    _show(result, json_out, render.transition)


@app.command()
def deactivate(
    ctx: typer.Context,
    adapter: str = typer.Argument(..., help="The adapter to remove from the active composition."),
    json_out: bool = JsonOpt,
) -> None:
    """Remove one adapter from the active composition."""
    _show(_store(ctx).deactivate(adapter), json_out, render.transition)


@app.command()
def rollback(
    ctx: typer.Context,
    steps: Optional[int] = typer.Option(None, "-n", parser=_integer, help="Go back N transitions (default 1)."),
    to: Optional[str] = typer.Option(None, "--to", metavar="ID", help="Go back to this composition id."),
    json_out: bool = JsonOpt,
) -> None:
    """Make an earlier composition active again (itself a logged transition)."""
    _show(_store(ctx).rollback(steps, to), json_out, render.transition)


@app.command()
def status(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """Show the active composition."""
    _show(_store(ctx).status(), json_out, render.status)


@app.command("log")
def log_cmd(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """Show the reflog: every transition of the active composition, newest first."""
    entries = _store(ctx).log()
    _show([e.to_json() for e in entries], json_out, render.reflog)


@app.command()
def fsck(
    ctx: typer.Context,
    repair: bool = typer.Option(False, "--repair", help="Restore the last consistent state; say what was done."),
    json_out: bool = JsonOpt,
) -> None:
    """Check every blob, manifest, name, ref and reflog line (re-hashing everything)."""
    _show(_store(ctx, check_config=False).fsck(repair, _progress(json_out)), json_out, render.fsck_report)


@app.command()
def gc(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; remove nothing."),
    json_out: bool = JsonOpt,
) -> None:
    """Remove blobs and records that no name, ref or reflog line can reach."""
    result = _store(ctx).gc(dry_run, on_plan=None if json_out else render.gc_plan)
    _show(result, json_out, render.gc_done)


@app.command()
def verify(
    ctx: typer.Context,
    ref: Optional[str] = typer.Argument(
        None, metavar="[COMPOSITION]", help="A composition id (or prefix), or a base name; default: the active one."),
    numerics: bool = typer.Option(True, "--numerics/--no-numerics",
                                  help="Also compare logits with the fresh-base oracle."),
    signature: bool = typer.Option(
        False, "--signature", help="Check the composition's signatures instead (trusted: config.toml "
                                   "trusted_keys and each --key)."),
    key: Optional[list[str]] = typer.Option(
        None, "--key", metavar="KEY",
        help="With --signature: a trusted public key (ed25519:BASE64 or a PEM file; repeatable). "
             "With --certificate: the Ed25519 PEM private key that signs it."),
    certificate: Optional[Path] = typer.Option(
        None, "--certificate", metavar="FILE",
        help="Write the result as a certificate signed with --key, bound to the composition id."),
    json_out: bool = JsonOpt,
) -> None:
    """Re-hash every blob of a composition and check its logits against the fresh-base oracle
    (--certificate: and write the result signed); --signature: check its signatures instead."""
    from slm import render_dist

    result = _store(ctx).verify_as_asked(ref, numerics, signature, key or [], certificate, _progress(json_out))
    _show(result, json_out, render_dist.verify_result)


@app.command("ls")
def ls(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """List the bases, adapters and compositions in the store."""
    _show(_store(ctx).ls(), json_out, render.entries_table)


@app.command()
def show(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="NAME|DIGEST|ID", help="A name, digest, composition id, or a prefix."),
    json_out: bool = JsonOpt,
) -> None:
    """Print a base, adapter or composition manifest."""
    _show(_store(ctx).show(ref), json_out, render.manifest)


ActivationsOpt = typer.Option(
    "float32", "--activations", metavar="float32|int8",
    help="int8: faster decoding, OPT-IN and less exact: the input of each quantized product is "
         "rounded to int8 per 32 values, as llama.cpp does, so logits move (measured in "
         "docs/numerics.md). float32 (default): within 1e-5 of the reference kernels.")


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    prompt: str = typer.Argument(..., help="The prompt; '-' reads it from standard input."),
    base: Optional[str] = typer.Option(
        None, "--base", "-b", help="Run this base alone instead of the active composition."),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n", parser=_integer, help="Stop after this many new tokens."),
    temperature: float = typer.Option(
        0.0, "--temperature", "-t", parser=_decimal,
        help="0 is greedy (deterministic); any finite value >= 0 (one so small that only the top "
             "logit keeps weight samples it, as greedy does)."),
    top_p: float = typer.Option(1.0, "--top-p", parser=_decimal, help="Nucleus sampling mass (with --temperature > 0)."),
    seed: int = typer.Option(0, "--seed", parser=_integer, help="Seed for sampling; the same seed gives the same text."),
    chat: bool = typer.Option(
        False, "--chat",
        help="Wrap the prompt in the base's chat template (the prompt is text: a control token "
             "spelled in it stays text)."),
    logits_out: Optional[Path] = typer.Option(
        None, "--logits-out", metavar="FILE.npy",
        help="Save float32 logits (positions x vocab) for every prompt and generated position.",
    ),
    memory_budget: Optional[str] = MemoryBudgetOpt,
    on_switch: str = typer.Option(
        "stop", "--on-switch", metavar="stop|finish",
        help="If the active composition changes mid-generation: stop at the next token "
             "(exit code 11) or finish on the composition generation started with."),
    threads: Optional[int] = typer.Option(
        None, "--threads", metavar="N",
        parser=_integer, help="Threads for the kernels (default: every core; 1 is faster when another program "
             "keeps a core busy). The text does not depend on it."),
    activations: str = ActivationsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Generate text on the active composition (or --base), streaming it."""
    import slm
    from slm.ops.run import RunOptions, prompt_from_stdin

    slm.keep_freed_memory()  # a setting of this process, as OPENBLAS_NUM_THREADS (slm/entry.py)

    if prompt == "-":  # read during start-up: Ctrl-C while it waits exits at once (slm/entry.py)
        prompt = prompt_from_stdin(sys.stdin)
    store = _store(ctx)
    options = RunOptions(prompt=prompt, base=base, max_tokens=max_tokens, temperature=temperature,
                         top_p=top_p, seed=seed, chat=chat, logits_out=logits_out,
                         memory_budget=memory_budget, on_switch=on_switch, threads=threads,
                         activations=activations)
    result = store.run(options, on_text=None if json_out else render.stream_text)
    _show(result, json_out, render.run_footer)


@app.command()
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback unless told otherwise)."),
    port: int = typer.Option(8080, "--port", parser=_integer, help="TCP port (0: any free port, printed at start)."),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="SLM_API_KEY", metavar="KEY", show_envvar=True,
        help="Require Authorization: Bearer KEY on every endpoint but /health."),
    max_batch: int = typer.Option(8, "--max-batch", metavar="N", parser=_integer, help="Requests decoded together in one step."),
    max_queue: Optional[int] = typer.Option(
        None, "--max-queue", metavar="N", parser=_integer, help="Requests waiting beyond the batch before HTTP 429 (default 4 x N)."),
    memory_budget: Optional[str] = MemoryBudgetOpt,
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N", parser=_integer, help="Threads for the kernels (default: every core)."),
    activations: str = ActivationsOpt,
    body_limit: int = typer.Option(1 << 20, "--body-limit", metavar="BYTES", parser=_integer, help="Largest request body accepted."),
    grace: float = typer.Option(10.0, "--grace", metavar="SECONDS",
                                parser=_decimal, help="On SIGTERM/SIGINT, how long running requests get to finish."),
    json_out: bool = JsonOpt,
) -> None:
    """Serve the store's compositions over an OpenAI-compatible HTTP API (docs/serve.md).

    Follows `slm activate` from other processes (hot swap); never writes to the store.
    Logs one line per request on stderr; with --json, one JSON object per line on stdout."""
    import slm
    from slm.server.app import json_log, stderr_log
    from slm.server.serve import ServeOptions
    from slm.server.serve import serve as run_server

    slm.keep_freed_memory()  # a setting of this process, as OPENBLAS_NUM_THREADS (slm/entry.py)

    options = ServeOptions(host=host, port=port, api_key=api_key, max_batch=max_batch, max_queue=max_queue,
                           memory_budget=memory_budget, threads=threads, activations=activations,
                           body_limit=body_limit, grace=grace)
    run_server(_store(ctx), options, log=json_log if json_out else stderr_log)


InsecureOpt = typer.Option(False, "--insecure", help="Allow plain HTTP to a registry that is not on loopback.")


@app.command("export")
def export_cmd(
    ctx: typer.Context,
    ref: Optional[str] = typer.Argument(
        None, metavar="[COMPOSITION|BASE|ADAPTER]", help="What to export (default: the active composition)."),
    out: Path = typer.Option(..., "-o", "--output", metavar="DIR|FILE.tar|FILE.gguf",
                             help="Where to write it (must not exist)."),
    fmt: str = typer.Option(
        "slm", "--format", metavar="slm|gguf-lora|peft",
        help="slm: an OCI image layout bundle (a .tar name writes a tar); gguf-lora: one LoRA adapter for "
             "llama.cpp; peft: one LoRA adapter as a PEFT directory."),
    base: Optional[str] = typer.Option(None, "--base", help="gguf-lora / peft of an ADAPTER: the base it is for."),
    tag: Optional[str] = typer.Option(None, "--tag", help="slm: the ref name in index.json (default: short id)."),
    json_out: bool = JsonOpt,
) -> None:
    """Export a composition as a bundle, or a LoRA adapter for llama.cpp or PEFT."""
    from slm import render_dist

    _show(_store(ctx).export(ref, out, fmt, base, tag, _progress(json_out)), json_out, render_dist.exported)


@app.command()
def push(
    ctx: typer.Context,
    reference: str = typer.Argument(..., metavar="HOST[:PORT]/REPO[:TAG]", help="Where to push (tag default: short id)."),
    ref: Optional[str] = typer.Argument(None, metavar="[COMPOSITION]", help="Default: the active composition."),
    insecure: bool = InsecureOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Upload a composition to an OCI registry (only the blobs it lacks)."""
    from slm import render_dist

    _show(_store(ctx).push(reference, ref, insecure, _progress(json_out)), json_out, render_dist.pushed)


@app.command()
def pull(
    ctx: typer.Context,
    reference: str = typer.Argument(..., metavar="HOST[:PORT]/REPO[:TAG|@sha256:..]", help="What to pull."),
    insecure: bool = InsecureOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Receive a composition from an OCI registry (only the blobs the store lacks; all verified)."""
    from slm import render_dist

    _show(_store(ctx).pull(reference, insecure, _progress(json_out)), json_out, render_dist.received)


@app.command()
def sign(
    ctx: typer.Context,
    ref: Optional[str] = typer.Argument(None, metavar="[COMPOSITION]", help="Default: the active composition."),
    key: Path = typer.Option(..., "--key", metavar="KEY.pem", help="Ed25519 private key (openssl genpkey -algorithm ed25519)."),
    json_out: bool = JsonOpt,
) -> None:
    """Sign a composition id with Ed25519; the signature is stored with the composition."""
    from slm import render_dist

    _show(_store(ctx).sign(ref, key), json_out, render_dist.signed)


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
    command it holds from their signatures before it parses anything, ~10 ms of each run for
    commands that do not run. The whole app when no known verb is named (`slm --help`, no
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
    except _Reported as reported:  # stdout holds the result; the error line goes to stderr
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
