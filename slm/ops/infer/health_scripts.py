"""The operator's health checks: the entries of health.d/ at the store's root, run in the order
of their names, each one a check ("script:NAME") of `slm health` (slm.ops.infer.health).

Only an executable regular file is run; a symlink, a FIFO, a directory, a device or a file
without an execute bit is reported "skipped" and neither opened nor run (so never waited on).
Each script is executed directly (no shell) with stdin closed, the environment of slm plus
SLM_COMPOSITION (the composition id) and SLM_STORE (the store's root), its working directory the
store's root, in a process group of its own. Its stdout and stderr are drained as they come and
only their last MAX_OUTPUT bytes kept, whatever it writes; past its deadline the whole process
group is killed, and so is whatever the script left running in it once it exits. A non-zero exit
(or a kill) fails the check, with the last line of stderr as the reason.
"""

from __future__ import annotations

import os
import selectors
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Iterator

from slm.errors import printable
from slm.ops.results.health import FAILED, PASSED, SKIPPED, HealthCheck

DIRECTORY = "health.d"
DEFAULT_TIMEOUT_S = 60.0
MAX_OUTPUT = 64 << 10  # bytes of each stream kept (the tail): the reason is stderr's last line
MAX_REASON = 200  # characters of that line in the report


def _not_runnable(entry: os.DirEntry) -> str | None:
    """Why an entry of health.d is not run (None: an executable regular file)."""
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError as err:
        return f"cannot be read: {err.strerror or err}"
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link: not run (health.d runs regular files only)"
    if stat.S_ISDIR(info.st_mode):
        return "a directory: not run"
    if stat.S_ISFIFO(info.st_mode):
        return "a FIFO: not run"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file: not run"
    if not info.st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH) or not os.access(entry.path, os.X_OK):
        return "not executable: not run (chmod +x to run it)"
    return None


def run_scripts(root: Path, comp_id: str, timeout_s: float) -> Iterator[HealthCheck]:
    """A check per entry of root/health.d, by name, each run when the previous is reported (a
    caller that stops at a failure runs no more). No health.d: no checks."""
    folder = root / DIRECTORY
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as err:
        yield HealthCheck(DIRECTORY, FAILED, f"{DIRECTORY} cannot be read: {err.strerror or err}", 0.0)
        return
    env = {**os.environ, "SLM_COMPOSITION": comp_id, "SLM_STORE": str(root)}
    for entry in entries:
        name = f"script:{printable(entry.name)}"
        start = time.monotonic()
        why = _not_runnable(entry)
        if why is not None:
            yield HealthCheck(name, SKIPPED, why, 0.0)
            continue
        passed, reason = run_script(Path(entry.path), env, root, timeout_s)
        yield HealthCheck(name, PASSED if passed else FAILED, reason, round(time.monotonic() - start, 3))


def run_script(path: Path, env: dict[str, str], cwd: Path, timeout_s: float) -> tuple[bool, str]:
    """(passed, reason) of one script run to its end or to its deadline."""
    try:
        proc = subprocess.Popen([str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True, close_fds=True)
    except OSError as err:  # an exec format error, a missing interpreter, permission denied
        return False, f"could not be started: {err.strerror or err}"
    try:
        exited = os.pidfd_open(proc.pid)  # readable once the script exits (it stays unreaped: see _exited)
    except OSError as err:  # a kernel without pidfds (before Linux 5.3)
        _kill_group(proc)
        proc.stdout.close()
        proc.stderr.close()
        return False, f"could not be watched: {err.strerror or err}"
    tails = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    killed = False
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        for stream in tails:
            os.set_blocking(stream.fileno(), False)
            sel.register(stream, selectors.EVENT_READ)
        sel.register(exited, selectors.EVENT_READ)
        try:
            # until both streams end; once the script exits, what it left running is killed (a
            # child holding its stdout open would otherwise keep a finished script "running")
            while len(sel.get_map()) > (exited in sel.get_map()):
                left = deadline - time.monotonic()
                if left <= 0:
                    killed = True
                    break
                for key, _ in sel.select(left):
                    if key.fileobj == exited:
                        sel.unregister(exited)
                        _kill_group(proc, reap=False)
                        continue
                    chunk = os.read(key.fileobj.fileno(), 1 << 16)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    tail = tails[key.fileobj]
                    tail += chunk
                    del tail[:-MAX_OUTPUT]
            killed = killed or not _exited(proc.pid, deadline)
        finally:
            _kill_group(proc)  # over its deadline, or done: nothing it started outlives it
            os.close(exited)
            for stream in tails:
                stream.close()
    if killed:
        return False, f"killed: still running after its deadline of {timeout_s:g} s"
    last = _last_line(bytes(tails[proc.stderr]))
    if proc.returncode != 0:
        what = f"exit {proc.returncode}" if proc.returncode > 0 else f"killed by signal {-proc.returncode}"
        return False, f"{what}: {last}" if last else what
    return True, last or "exit 0"


def _exited(pid: int, deadline: float) -> bool:
    """Whether the script exited by the deadline; left unreaped, so that its pid still names its
    process group when the group is killed."""
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _kill_group(proc: subprocess.Popen, reap: bool = True) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already
    if reap:
        proc.wait()


def _last_line(data: bytes) -> str:
    lines = [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return printable(lines[-1].strip())[:MAX_REASON] if lines else ""
