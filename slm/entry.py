"""The `slm` command's entry point: as light as a module can be, so that Ctrl-C while the CLI
is still being imported (typer, rich, NumPy: a few hundred ms) says "interrupted" and exits
130 like Ctrl-C at any later moment, instead of printing a KeyboardInterrupt traceback."""

import sys


def main() -> None:
    try:
        from slm.cli import run

        code = run()
    except KeyboardInterrupt:
        print("slm: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
