"""The chat-template renderer: a template is code that came with a file, so it runs in a
separate process with every resource bounded, never in the process that asked.

A render that takes longer than RENDER_SECONDS (wall clock), needs more than MEMORY_BYTES of
address space or writes more than MAX_OUTPUT_CHARS is refused (BoundExceeded, an InvalidInput)
and its process killed; the next render starts a fresh one. Up to WORKERS renders run at once,
each in its own process (a template that hangs holds one of them for RENDER_SECONDS, never the
others). Workers are started with subprocess (fork and exec of a new interpreter, with none of
this process's threads, locks or memory), in isolated mode (no current directory or environment
variable on their module path), and kept for the next render. The messages each way are
length-prefixed JSON, each bounded before it is read.

These bounds are the ones docs/formats.md documents; a normal chat's render costs one round
trip to a waiting worker.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from slm.errors import InvalidInput, IOFailure

RENDER_SECONDS = 2.0  # wall clock, per render; a chat template renders in milliseconds
CPU_SECONDS = 3  # CPU time per render, the worker's own limit (RLIMIT_CPU): the backstop if the deadline is missed
MEMORY_BYTES = 256 << 20  # the worker's address space (RLIMIT_AS), interpreter and jinja2 included
MAX_OUTPUT_CHARS = 8 << 20  # far beyond any context's worth of text (a token is a few characters)
MAX_REQUEST_BYTES = 64 << 20  # the conversation and tools as JSON (the server's bodies are smaller)
START_SECONDS = 60.0  # a worker's start (an interpreter and jinja2) on a busy machine
WORKERS = 4  # renders at once; a render past them waits for a worker

HEADER = struct.Struct(">Q")
# JSON (not limited to ASCII) writes a character in at most 6 bytes (a control character's \uXXXX)
MAX_REPLY_BYTES = 6 * MAX_OUTPUT_CHARS + 4096


STOPPED = "the chat template's renderer stopped (its memory or CPU limit)"


MAX_MESSAGE_CHARS = 300  # of a template's error message in slm's one-line error


def _shortened(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "... (cut)"


class BoundExceeded(InvalidInput):
    """A template used more time, memory or output than a render may."""


class _Worker:
    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the slm package
        code = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "from slm.model.template_worker import main; sys.exit(main(sys.argv[2:]))")
        limits = [str(v) for v in (MEMORY_BYTES, CPU_SECONDS, MAX_OUTPUT_CHARS, MAX_REQUEST_BYTES)]
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", code, root, *limits],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     close_fds=True)
        try:
            self._read(1, time.monotonic() + START_SECONDS)  # it is ready: its imports and limits are in place
        except BoundExceeded:
            self.kill()
            raise IOFailure(f"the chat-template renderer did not start within {START_SECONDS:g} s") from None

    def exchange(self, payload: bytes) -> dict:
        """The worker's reply to one request (BoundExceeded past RENDER_SECONDS or if the worker
        died: killed by its own limits)."""
        try:
            self.proc.stdin.write(HEADER.pack(len(payload)) + payload)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise BoundExceeded(STOPPED) from None
        deadline = time.monotonic() + RENDER_SECONDS
        (size,) = HEADER.unpack(self._read(HEADER.size, deadline))
        if size > MAX_REPLY_BYTES:
            raise BoundExceeded(f"the chat template's output is over {MAX_OUTPUT_CHARS} characters")
        return decode(self._read(size, deadline))

    def _read(self, size: int, deadline: float) -> bytes:
        fd, out = self.proc.stdout.fileno(), bytearray()
        while len(out) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise BoundExceeded(f"the chat template took more than {RENDER_SECONDS:g} s to render")
            chunk = os.read(fd, min(size - len(out), 1 << 20))
            if not chunk:
                raise BoundExceeded(STOPPED)
            out += chunk
        return bytes(out)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


class _Pool:
    def __init__(self, size: int):
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []

    def render(self, request: dict) -> str:
        payload = encode(request)
        if len(payload) > MAX_REQUEST_BYTES:
            raise InvalidInput(f"the conversation is over {MAX_REQUEST_BYTES} bytes as JSON; its template "
                               "cannot render it")
        with self._slots:
            worker = self._take()
            try:
                reply = worker.exchange(payload)
            except BaseException:  # a bound, or an interruption mid-render: the worker's state is unknown
                worker.kill()
                raise
            if reply.get("ends"):  # it ends after this reply
                worker.kill()
            else:
                self._give_back(worker)
        if "error" in reply:  # (a template's own message, raise_exception's, cut to a line's length)
            raise (BoundExceeded if reply.get("bound") else InvalidInput)(_shortened(reply["error"]))
        return reply["text"]

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.kill()
        return _Worker()

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def forget(self) -> None:
        """In a forked child: the parent's workers are the parent's (their pipes are shared), so
        this process starts its own."""
        self._slots, self._lock, self._idle = threading.BoundedSemaphore(WORKERS), threading.Lock(), []

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_pool = _Pool(WORKERS)
atexit.register(_pool.close)
os.register_at_fork(after_in_child=_pool.forget)


def encode(message: dict) -> bytes:
    """A message as JSON in UTF-8; a lone surrogate (undecodable text) passes, for the text's
    own check to report."""
    return json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass")


def decode(data: bytes) -> dict:
    return json.loads(data.decode("utf-8", "surrogatepass"))


def render(request: dict) -> str:
    """The text of slm.model.chat.render_here(**request), rendered in a worker process."""
    return _pool.render(request)
