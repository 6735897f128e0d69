"""The `slm` command's entry point: as light as a module can be, so that Ctrl-C while the CLI
is still being imported (typer, rich, NumPy: a few hundred ms) says "interrupted" and exits
130 like Ctrl-C at any later moment, instead of printing a KeyboardInterrupt traceback."""

import os
import sys


def main() -> None:
    # slm parallelises its matrix-vector work itself (C kernels on OpenMP threads, and two
    # threads for a prompt's BLAS work). A multi-threaded OpenBLAS pool spinning beside them
    # made a decode step on 2 busy cores 20-100x slower (docs/benchmarks.md): a default for
    # the command, set before NumPy loads. A program that embeds slm sets its own (docs/api.md);
    # importing slm sets nothing.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        from slm.cli import run

        code = run()
    except KeyboardInterrupt:
        print("slm: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
