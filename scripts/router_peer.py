"""The router peer: vLLM's router (the `vllm-router` command of the pinned `vllm-router` package, the dev extra)
as a process in front of `slm serve` replicas: started on loopback with free ports (its own and
its Prometheus exporter's), ready within a deadline, stopped (killed if need be) on the way out.

Used by tests/fleet/ and scripts/bench_router.py. The flags that make a fleet test finish in
seconds rather than minutes: the router re-checks every worker's /health each second, one
failure marks a worker unhealthy and one success re-admits it, and its circuit breaker (which
also takes a failing worker out) half-opens after a second.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from bench_http import free_port

READY_S = 120.0  # a router that has not admitted its workers by then has failed
POLICIES = ("round_robin", "cache_aware", "consistent_hash", "power_of_two")
# Health checks and the circuit breaker at fleet-test speed (see the module's docstring).
FAST_HEALTH = ("--health-check-interval-secs", "1", "--health-check-timeout-secs", "2",
               "--health-failure-threshold", "1", "--health-success-threshold", "1",
               "--cb-timeout-duration-secs", "1", "--worker-startup-check-interval", "1")


def executable() -> str | None:
    """The vllm-router command beside this Python (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "vllm-router"
    return str(beside) if beside.exists() else shutil.which("vllm-router")


def get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    """(status, body) of a GET; (0, reason) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError as err:
        return 0, str(err).encode()


class Router:
    """A running vllm-router: `url` (http://127.0.0.1:PORT), `log` (its output, a file)."""

    def __init__(self, workers: list[str], policy: str, log: Path, extra: tuple[str, ...] = FAST_HEALTH,
                 request_timeout_s: int = 120):
        exe = executable()
        if exe is None:
            raise RuntimeError("vllm-router is not installed (pip install vllm-router; the dev extra has it)")
        port = free_port()
        self.url, self.log, self.policy = f"http://127.0.0.1:{port}", log, policy
        cmd = [exe, "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(free_port()), "--policy", policy, "--worker-urls", *workers,
               "--request-timeout-secs", str(request_timeout_s), "--log-level", "warning", *extra]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            self.wait_healthy(READY_S)
        except BaseException:
            self.stop()
            raise

    def healthy(self) -> bool:
        """The router's own /health: 200 when it counts every worker healthy (503 otherwise)."""
        return get(self.url + "/health")[0] == 200

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited ({self.proc.returncode}): {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm-router did not count every worker healthy within {timeout:.0f} s: "
                                   f"{self.tail()}")
            time.sleep(0.2)

    def tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


@contextmanager
def vllm_router(workers: list[str], policy: str, log: Path, **kwargs):
    """A Router for the length of a `with` block."""
    router = Router(workers, policy, log, **kwargs)
    try:
        yield router
    finally:
        router.stop()
