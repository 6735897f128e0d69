"""`slm follow`: follow a registry tag (docs/fleet.md).

No `from __future__ import annotations` in slm/cli (typer reads the annotations)."""

import signal
import sys
import threading
from typing import Optional

import typer

from slm import render
from slm.cli.common import InsecureOpt, JsonOpt, app, decimal, open_store, show_result


@app.command()
def follow(
    ctx: typer.Context,
    reference: Optional[str] = typer.Argument(
        None, metavar="HOST[:PORT]/REPO:TAG", help="The registry tag to follow (not needed with --status, "
                                                   "--clear-bad or --forget)."),
    interval: Optional[str] = typer.Option(
        None, "--interval", metavar="DURATION",
        help="Time between rounds (30s, 5m, 1h; a bare number is seconds); default: config.toml's "
             "[follow] interval, else 5m."),
    once: bool = typer.Option(False, "--once", help="Run one round and exit: 0 when the device ends it updated or "
                                                    "current, else the refusal's or the rollback's code."),
    status: bool = typer.Option(False, "--status", help="Print what the store follows, what is good, on trial and "
                                                        "bad, and the last round's report; then exit."),
    clear_bad: bool = typer.Option(False, "--clear-bad", help="Forget the bad marks (of --digest, else all): "
                                                              "what they name may be tried again."),
    digest: Optional[str] = typer.Option(None, "--digest", metavar="DIGEST",
                                         help="--clear-bad: only the mark of this manifest digest or composition id "
                                              "(whole, or its first 12 or more hex digits as --status shows)."),
    forget: bool = typer.Option(False, "--forget", help="Forget the followed tag, its versions and bad marks "
                                                        "(what is active stays); then exit."),
    timeout: float = typer.Option(60.0, "--timeout", metavar="S", parser=decimal,
                                  help="Each health.d script's deadline, in seconds."),
    insecure: bool = InsecureOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Follow a registry tag: each round judges its signed statement (version, expiry, tag), pulls a
    new version, activates it as a trial, runs the health checks, and marks it good or rolls it back
    (docs/fleet.md). Loops until stopped (each round a line; with --json a JSON object per line)."""
    from slm import render_dist

    def on_round(result, error) -> None:
        if json_out:
            doc = result.to_json() if result is not None else {
                "error": " ".join(str(error).split()), "exit_code": int(error.code)}
            sys.stdout.write(render.json_line(doc))
            sys.stdout.flush()
        elif result is not None:
            render_dist.follow_round(result)
        else:
            print(f"error: {render.printable(' '.join(str(error).split()))}", flush=True)

    # SIGTERM (systemctl stop) ends the loop once the round in progress is over: a trial is not
    # cut short to be counted as a death (the unit's TimeoutStopSec bounds the wait)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    result = open_store(ctx).follow_as_asked(
        reference, status=status, clear_bad=clear_bad, digest=digest, forget=forget, insecure=insecure,
        interval=interval, once=once, timeout_s=timeout, on_round=on_round, stop=stop)
    if result is None:  # the loop ended (it runs until stopped)
        return
    printer = {"FollowStatus": render_dist.follow_status, "FollowRound": render_dist.follow_round}.get(
        type(result).__name__, render_dist.follow_done)
    show_result(result, json_out, printer)
