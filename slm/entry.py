"""The `slm` command's entry point: as light as a module can be, so that Ctrl-C while the CLI
is still being imported (typer, rich, NumPy: a few hundred ms) says "interrupted" and exits
130 like Ctrl-C at any later moment, instead of printing a KeyboardInterrupt traceback.

Ctrl-C is handled in two stages (docs/exit-codes.md):

- start-up: from this module's first line until the command opens the store (imports, the
  command line, `slm run -` reading its prompt), Ctrl-C prints `slm: interrupted` and exits
  130 on the spot. Nothing has been changed, so nothing needs undoing, and a KeyboardInterrupt
  raised in the middle of an import is not reliably a KeyboardInterrupt: CPython discards it
  when it lands in a weakref callback (importlib's own module locks have one; the command then
  went on, read an empty prompt and exited 4), wraps it in RuntimeError when it lands in a
  descriptor's __set_name__, and makes the process die by SIGINT at exit when it escaped code
  run by eval/exec (namedtuple and dataclass creation).
- the command's work: slm.cli hands Ctrl-C back to Python's KeyboardInterrupt when it opens
  the store (slm.cli.common.hand_ctrl_c_to_the_command), so what the command began unwinds (a
  transaction rolls back) before it says `slm: interrupted` and exits 130.
"""

import os
import signal
import sys

INTERRUPTED = 130
INTERRUPTED_LINE = b"slm: interrupted\n"


def exit_at_once(signum, frame) -> None:
    """The SIGINT handler of start-up: nothing to undo yet, so say it and leave."""
    os.write(2, INTERRUPTED_LINE)
    os._exit(INTERRUPTED)


def main() -> None:
    signal.signal(signal.SIGINT, exit_at_once)  # before anything slow: start-up begins here
    # slm parallelises its matrix-vector work itself (C kernels on OpenMP threads, and two
    # threads for a prompt's BLAS work). A multi-threaded OpenBLAS pool spinning beside them
    # would take the cores they wait for, many times over on a small busy machine: a default for
    # the command, set before NumPy loads. A program that embeds slm sets its own (docs/api.md);
    # importing slm sets nothing.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        from slm.cli import run

        code = run()
    except KeyboardInterrupt:
        print("slm: interrupted", file=sys.stderr)
        code = INTERRUPTED
    if code == INTERRUPTED:
        # The command has unwound and said so. Leave with 130 ourselves: had the interrupt
        # passed through code run by eval/exec (a lazy import's dataclasses), the interpreter
        # would otherwise end the process by SIGINT at exit, whatever code we return.
        _flush(sys.stdout, sys.stderr)
        os._exit(INTERRUPTED)
    sys.exit(code)


def _flush(*streams) -> None:
    for stream in streams:
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
