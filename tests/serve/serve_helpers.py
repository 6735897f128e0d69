"""A real `slm serve` process for tests: started on a free loopback port, stopped after."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

START_TIMEOUT_S = 120


class Server:
    """`python -m slm --store DIR serve --port PORT ARGS...` (port 0: any free one); its stderr
    lines are kept."""

    def __init__(self, store_dir, *args: str, env: dict | None = None, port: int = 0):
        self.proc = subprocess.Popen([sys.executable, "-m", "slm", "--store", str(store_dir), "serve", "--port",
                                      str(port), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=env)
        self.lines: list[str] = []
        self._new: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_for("listening on http://", START_TIMEOUT_S).split("listening on ")[1].split()[0]

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            self._new.put(line)
        self._new.put(None)

    def _wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._new.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                raise AssertionError("the server exited: " + "\n".join(self.lines))
            if text in line:
                return line
        raise AssertionError(f"no {text!r} from the server within {timeout} s: " + "\n".join(self.lines))

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"the server did not exit within {timeout} s of {signal.Signals(sig).name}; "
                                 "its log:\n" + "\n".join(self.lines)) from None

    def http(self, method: str, path: str, body: bytes | dict | None = None, headers: dict | None = None,
             timeout: float = 60) -> tuple[int, dict, bytes]:
        """(status, headers lower-cased, body) of one plain HTTP request."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as err:
            return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()

    def json(self, method: str, path: str, body=None, headers=None) -> tuple[int, dict]:
        status, _, data = self.http(method, path, body, headers)
        return status, json.loads(data)

    def status(self) -> dict:
        return self.json("GET", "/v1/slm/status")[1]

    def client(self, api_key: str = "none"):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120)
