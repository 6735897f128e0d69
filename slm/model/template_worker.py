"""The chat-template renderer's process (started by slm.model.template_sandbox, which documents
the bounds): it sets its own limits, says it is ready, then answers one request at a time on
stdin/stdout, length-prefixed JSON both ways, until stdin closes."""

from __future__ import annotations

import resource
import signal
import sys

from slm.errors import InvalidInput
from slm.model.template_sandbox import HEADER, BoundExceeded, decode, encode


def main(argv: list[str]) -> int:
    memory, cpu_seconds, max_chars, max_request = map(int, argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the terminal is the parent's to handle
    from slm.model.chat import render_here

    render_here("", [], {}, False, None, max_chars)  # jinja2 loaded before the memory limit
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(b"R")
    stdout.flush()
    while True:
        header = stdin.read(HEADER.size)
        if len(header) < HEADER.size:
            return 0  # the parent closed the pipe (or ended)
        (size,) = HEADER.unpack(header)
        if size > max_request:
            return 1  # the parent checks this bound before it sends: a broken parent
        request = decode(stdin.read(size))
        _limit_cpu(cpu_seconds)
        try:
            reply = {"text": render_here(**request, max_chars=max_chars)}
        except BoundExceeded as err:
            reply = {"error": str(err), "bound": True}
        except InvalidInput as err:
            reply = {"error": str(err)}
        except (MemoryError, RecursionError) as err:  # this process may be in a bad state: the next render gets a fresh one
            what = "memory" if isinstance(err, MemoryError) else "recursion depth"
            reply = {"error": f"the chat template needs more {what} than a render may have", "bound": True, "ends": True}
        data = encode(reply)
        stdout.write(HEADER.pack(len(data)) + data)
        stdout.flush()
        if reply.get("ends"):
            return 0


def _limit_cpu(seconds: int) -> None:
    """The next render's CPU time: what this process has used so far plus `seconds`."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime) + seconds
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
