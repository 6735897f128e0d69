"""Write docs/cli.md from the commands' own --help (CI checks that it is up to date).

    python scripts/gen_cli_docs.py          # rewrite docs/cli.md
    python scripts/gen_cli_docs.py --check  # exit 1 if docs/cli.md is stale
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def _commands(group, prefix):
    import click

    ctx = click.Context(group, info_name=" ".join(prefix))
    yield prefix, group
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        if hasattr(sub, "list_commands"):
            yield from _commands(sub, [*prefix, name])
        else:
            yield [*prefix, name], sub


def render() -> str:
    os.environ["COLUMNS"] = "100"
    os.environ["NO_COLOR"] = "1"
    os.environ["TERM"] = "dumb"
    import io
    from contextlib import redirect_stdout

    import typer.main

    from slm.cli import app, run

    parts = ["# CLI reference\n", "Generated from `--help` by `scripts/gen_cli_docs.py`; "
             "do not edit by hand. Exit codes: [exit-codes.md](exit-codes.md).\n",
             "Numbers (`<int>`, `<float>` options, an adapter's `@WEIGHT`) are written in ASCII decimal "
             "digits (`12`, `-0.5`, `.5`, `1e-3`); `1_0` and non-ASCII digits are refused "
             "([concepts.md](concepts.md#compositions-and-their-identity)).\n"]
    for path, _ in _commands(typer.main.get_command(app), ["slm"]):
        buf = io.StringIO()
        with redirect_stdout(buf):
            run([*path[1:], "--help"])
        text = "\n".join(line.rstrip() for line in buf.getvalue().splitlines()).strip("\n")
        parts.append(f"## `{' '.join(path)}`\n\n```\n{text}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        if not DOC.is_file() or DOC.read_text() != text:
            sys.exit("docs/cli.md is stale: run python scripts/gen_cli_docs.py")
    else:
        DOC.write_text(text)
