"""Test hook: inject crashes and I/O errors into the fs layer (SQLite test6.c style).

Selected by the environment variable SLM_FAULTS, read once when the CLI starts:

    SLM_FAULTS=crash@point=ref.before-replace   exit at once (os._exit) at a named point
    SLM_FAULTS=crash@op=7                        exit at once before the 7th fs operation
    SLM_FAULTS=eio@op=3                          the 3rd fs operation fails with EIO
    SLM_FAULTS=enospc@op=3                       ... with ENOSPC
    SLM_FAULTS=pause@point=import.staged         stop there for SLM_FAULTS_PAUSE_S seconds (default
                                                 5), saying "slm-fault paused NAME" on stderr
                                                 (concurrency tests: what can run meanwhile)
    SLM_FAULTS=trace                             print every fs operation to stderr
    SLM_FAULTS=powercut@op=N:seed=S:mode=M:root=DIR
                                                 a simulated power cut before the Nth operation:
                                                 unsynced data and directory entries under DIR
                                                 are dropped, kept or torn (slm/store/testing/powercut.py)

Operations are counted from 1 in the order the fs layer performs them (named points are
not counted). A crash exits with CRASH_EXIT_CODE without flushing or cleaning anything, as
a power cut would leave the process. This is a test hook, not a user feature.
"""

from __future__ import annotations

import errno
import os
import sys
import time

from slm.errors import IOFailure, UsageError
from slm.store import fs

ENV = "SLM_FAULTS"
CRASH_EXIT_CODE = 86


class FaultPlan:
    def __init__(self, spec: str):
        self.spec = spec
        self.count = 0
        self.trace = spec == "trace"
        self.action, _, where = spec.partition("@")
        self.point = where.removeprefix("point=") if where.startswith("point=") else None
        op = where.removeprefix("op=") if where.startswith("op=") else None
        self.op = int(op) if op is not None and op.isdigit() else None
        if not self.trace and (self.action not in ("crash", "eio", "enospc", "pause") or
                               (self.point is None and self.op is None)):
            raise UsageError(f"bad {ENV}={spec!r} (a test hook: crash|eio|enospc|pause@op=N|point=NAME, "
                             "or trace)")

    def __call__(self, op: str, detail: str) -> None:
        if op == "point":
            if self.trace:
                print(f"slm-fault point {detail}", file=sys.stderr)
            if detail == self.point:
                self._fire(op, detail)
            return
        self.count += 1
        if self.trace:
            print(f"slm-fault op {self.count} {op} {detail}", file=sys.stderr)
        if self.count == self.op:
            self._fire(op, detail)

    def _fire(self, op: str, detail: str) -> None:
        if self.action == "crash":
            os._exit(CRASH_EXIT_CODE)
        if self.action == "pause":
            print(f"slm-fault paused {detail}", file=sys.stderr, flush=True)
            time.sleep(float(os.environ.get("SLM_FAULTS_PAUSE_S", "5")))
            return
        code = errno.EIO if self.action == "eio" else errno.ENOSPC
        raise IOFailure(f"cannot {op} {detail}: {os.strerror(code)} (injected)")


# A plan installed by a test for a whole in-process session (several `slm.cli.run` calls under
# one power-cut simulator); while set, the environment is not consulted.
pinned = None


def install(plan) -> None:
    """Make `plan` the fs layer's fault hook (None: no faults); a power-cut plan also observes
    every fsync."""
    fs.fault_hook = plan
    fs.sync_observer = getattr(plan, "observe_sync", None)


def install_from_env() -> None:
    if pinned is not None:
        install(pinned)
        return
    spec = os.environ.get(ENV)
    if spec and spec.startswith("powercut@"):
        from slm.store.testing.powercut import PowerCut

        install(PowerCut.from_spec(spec))
        return
    install(FaultPlan(spec) if spec else None)
