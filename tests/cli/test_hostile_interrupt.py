"""Ctrl-C at every stage of the `slm` command (issue 36): always `slm: interrupted`, exit 130.

A KeyboardInterrupt raised in the middle of an import is not reliably one: CPython discards it
when it lands in a weakref callback (importlib's module locks have one), wraps it in
RuntimeError in a descriptor's __set_name__, and ends the process by SIGINT at exit when it
escaped code run by exec (dataclasses, namedtuples). Under load the signal of `make test`'s
old Ctrl-C test landed there: `slm run -` went on and said "the prompt is empty" (exit 4).

The instants are reached by observing the process (what it has mapped, the system call it
waits in), or, where only a hook can reach one, by the process raising a real SIGINT on
itself at that point; never by sleeping and hoping.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S, copy_store, snapshot, tiny_store, wait_until

pytestmark = pytest.mark.hostile

SLM = [sys.executable, "-m", "slm"]
INTERRUPTED = b"slm: interrupted\n"


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """A store with the tiny base active."""
    return tiny_store(tmp_path_factory.mktemp("interrupt"), tiny_model)


@pytest.fixture
def store_dir(template, tmp_path) -> Path:
    return copy_store(template, tmp_path)


def has_mapped(pid: int, fragment: str) -> bool:
    try:
        return fragment in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def interrupted_after(proc: subprocess.Popen) -> tuple[int, bytes]:
    """SIGINT now; then the exit code and stderr. stdin stays open until the process ends: a
    Ctrl-C it swallowed leaves it waiting for its prompt (a hang), not reading an empty one."""
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=HANG_S)
    proc.stdin.close()
    return code, proc.stderr.read()


@contextlib.contextmanager
def run_dash(store_dir):
    """`slm run -`, its prompt still to come; killed if the test ends before it does."""
    proc = subprocess.Popen([*SLM, "--store", str(store_dir), "run", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_while_the_command_imports_says_interrupted(store_dir):
    """NumPy's extension is mapped when `slm run` imports what it needs, before it reads its
    prompt: the signal lands in those imports (or, at the latest, in the read). The read itself:
    tests/cli/test_hostile.py::test_ctrl_c_while_a_command_works_says_interrupted."""
    with run_dash(store_dir) as proc:
        wait_until(lambda: has_mapped(proc.pid, "_multiarray_umath"), "NumPy in the process", proc=proc)
        assert interrupted_after(proc) == (130, INTERRUPTED)


# The process raises a real SIGINT on itself at the chosen point of the import of a module
# (signal.raise_signal runs the handler there and then), as a Ctrl-C arriving then would. The
# hook is a sitecustomize module, which Python imports before it runs `-m slm`: the command
# runs exactly as a user runs it (`python -m slm`: the interpreter's own exit path included).
LANDING = """
import os, signal, sys, weakref
module, where = os.environ["LANDING_MODULE"], os.environ["LANDING_WHERE"]
def ctrl_c():
    signal.raise_signal(signal.SIGINT)
class Landing:
    def find_spec(self, name, path=None, target=None):
        if name != module:
            return None
        sys.meta_path.remove(self)
        with open(os.environ["LANDING_REPORT"], "w") as report:  # which handler the signal meets
            report.write(getattr(signal.getsignal(signal.SIGINT), "__name__", "?"))
        if where == "weakref-callback":
            class Referent:
                pass
            referent = Referent()
            ref = weakref.ref(referent, lambda _: ctrl_c())
            del referent  # the callback runs now
        elif where == "exec":
            exec("ctrl_c()", {"ctrl_c": ctrl_c})
        elif where == "set-name":
            class Descriptor:
                def __set_name__(self, owner, name):
                    ctrl_c()
            type("Owner", (), {"field": Descriptor()})
        else:
            ctrl_c()
        return None
sys.meta_path.insert(0, Landing())
"""
WHERE = ["plain", "weakref-callback", "exec", "set-name"]


def slm_with_ctrl_c_at(tmp_path, store_dir, module: str, where: str, *args: str) -> tuple[str, int, bytes]:
    """(the SIGINT handler in place when the signal came, the exit code, stderr)."""
    hook = tmp_path / "landing"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(LANDING)
    report = tmp_path / "handler"
    env = {**os.environ, "LANDING_MODULE": module, "LANDING_WHERE": where, "LANDING_REPORT": str(report),
           "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([*SLM, "--store", str(store_dir), *args], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=HANG_S, env=env)
    return report.read_text(), r.returncode, r.stderr


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("module", ["typer", "numpy"])
def test_ctrl_c_anywhere_in_start_up_says_interrupted(tmp_path, store_dir, module, where):
    """typer: the CLI's own imports; numpy: `slm run`'s, before it reads its prompt. Before
    this fix: in a weakref callback it was swallowed (exit 4, "the prompt is empty"), through
    exec the process said "interrupted" and died by SIGINT, in __set_name__ a traceback."""
    assert slm_with_ctrl_c_at(tmp_path, store_dir, module, where, "run", "-") == ("exit_at_once", 130, INTERRUPTED)


def test_ctrl_c_after_the_store_is_open_unwinds_and_exits_130(tmp_path, store_dir):
    """Once the store is open, Ctrl-C is a KeyboardInterrupt again (what the command began
    unwinds); one that passed through exec (a lazy import's dataclasses) still ends in exit
    130, not in death by SIGINT. Loading the model imports slm.quant.registry, after the store opened."""
    before = snapshot(store_dir)
    landed = slm_with_ctrl_c_at(tmp_path, store_dir, "slm.quant.registry", "exec", "run", "hello")
    assert landed == ("default_int_handler", 130, INTERRUPTED)
    assert snapshot(store_dir) == before


def test_a_program_calling_the_cli_keeps_its_own_ctrl_c_handler(store_dir):
    """Only the `slm` command's own start-up handler is handed back when the store opens."""
    probe = ("import signal; from slm.cli import run; mine = lambda *a: None; "
             "signal.signal(signal.SIGINT, mine); "
             f"code = run(['--store', {str(store_dir)!r}, 'status']); "
             "print(code, signal.getsignal(signal.SIGINT) is mine)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=HANG_S)
    assert r.stdout.split()[-2:] == ["0", "True"], r.stderr
