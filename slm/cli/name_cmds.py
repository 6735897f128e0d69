"""`slm` commands on names (refs with a history): tag, rm, mv. `slm log NAME` is in store_cmds.

No `from __future__ import annotations` in slm/cli (typer reads the annotations)."""

import typer

from slm import render
from slm.cli.common import JsonOpt, app, open_store, show_result


@app.command()
def tag(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The tag: a new name, or an existing tag to move."),
    spec: str = typer.Argument(
        ..., metavar="SPEC",
        help="The composition: BASE+ADAPTER[@WEIGHT]..., a tag, an id or prefix, @active[~N], NAME@{N}, "
             "HOST/repo:tag."),
    json_out: bool = JsonOpt,
) -> None:
    """Name a composition (validated as activating it would be); an existing tag moves."""
    show_result(open_store(ctx).tag(name, spec), json_out, render.name_move)


@app.command()
def rm(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A base, adapter, tag or pulled reference name."),
    force: bool = typer.Option(
        False, "--force",
        help="Remove a base or adapter even if the active composition, a tag or a pulled reference "
             "uses it (without it: exit 19)."),
    json_out: bool = JsonOpt,
) -> None:
    """Remove a name; its log stays, its objects until `slm gc` expires them."""
    show_result(open_store(ctx).rm(name, force), json_out, render.name_move)


@app.command()
def mv(
    ctx: typer.Context,
    old: str = typer.Argument(..., help="The name to rename."),
    new: str = typer.Argument(..., help="Its new name (must be free)."),
    json_out: bool = JsonOpt,
) -> None:
    """Rename a base, adapter or tag: NEW takes OLD's object, then OLD goes."""
    moves = open_store(ctx).mv(old, new)
    show_result([m.to_json() for m in moves], json_out, render.name_moves)
