"""`slm serve`: the catalog, the scheduler and the HTTP app on uvicorn, in the foreground.

Shutdown (SIGTERM or SIGINT): the scheduler admits nothing new (503) and /health answers 503
at once, so that a router stops sending; the server keeps listening while requests run, so
that a router's health check reaches it. Running requests go on until `grace` seconds less
min(1 s, grace / 4), then whatever is left is cancelled (its stream ends, a whole answer gets
a 503 JSON error). Once nothing runs (or the grace period is out), uvicorn stops accepting
connections, closes the idle ones and waits for the responses still open; the process exits
0, within about the grace period plus one prefill chunk (the scheduler stops between two
chunks; tests/serve/test_serve_real.py, tests/serve/test_hostile_serve.py); a client that
stops reading its stream can hold the exit up to STRAGGLER_S longer.
A second signal cancels at once; the handlers still answer, and the process exits 0.

With `follow` (`slm serve --follow REF`), the server follows a registry tag on a thread of its
own (slm.server.follower): the first signal stops its loop, and the drain waits for a round in
progress as for a running request.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from dataclasses import dataclass

from slm import InvalidInput, IOFailure, UsageError
from slm.api import Runtime, Store, check_threads
from slm.server.app import DEFAULT_BODY_LIMIT, build_app, stderr_log
from slm.server.catalog import Catalog
from slm.server.follower import Follower
from slm.server.metrics import Metrics

MAX_BATCH = 64
MAX_PREFILL_CHUNK = 8192
# Once nothing runs or the grace period is out, uvicorn waits this long for the responses
# still open before it cancels their handlers (a plain-text 500 and a traceback each). The
# scheduler has cancelled every request by then, and the handlers answer as soon as it ends
# its current prefill chunk or decode step (seconds on a loaded machine); only a client that
# stopped reading its stream can take longer.
STRAGGLER_S = 30.0
DRAIN_POLL_S = 0.05  # how often a draining server looks whether anything still runs


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    max_batch: int = 8
    max_queue: int | None = None  # None: 4 x max_batch
    memory_budget: str | None = None
    threads: int | None = None
    exact: bool = False  # float32 products; the default is int8 where the kernels have it (docs/numerics.md)
    body_limit: int = DEFAULT_BODY_LIMIT
    grace: float = 10.0  # seconds running requests get to finish after SIGTERM
    prefill_chunk: int | None = None  # prompt positions a prefill pass takes between two decode steps
    # (None: slm run's chunk)
    follow: str | None = None  # a registry tag the server follows (docs/fleet.md)
    follow_interval: str | None = None  # a duration; None: config.toml's [follow] interval
    insecure: bool = False  # the registry over plain HTTP (as `slm pull --insecure`)


def check(o: ServeOptions, model: str | None = None) -> None:
    """The options (and `slm serve --model`'s REF beside them) before anything is done."""
    if o.follow is not None and model is not None:
        raise UsageError("--follow and --model do not go together: the follower pulls and activates what the tag names")
    if o.follow_interval is not None and o.follow is None:
        raise UsageError("--follow-interval goes with --follow")
    if not 0 <= o.port <= 65535:
        raise InvalidInput(f"--port must be between 0 and 65535, not {o.port}")
    if not 1 <= o.max_batch <= MAX_BATCH:
        raise InvalidInput(f"--max-batch must be between 1 and {MAX_BATCH}")
    if o.max_queue is not None and o.max_queue < 0:
        raise InvalidInput("--max-queue must be >= 0")
    if o.api_key is not None and (not o.api_key or not all("!" <= c <= "~" for c in o.api_key)):
        # HTTP carries header values as bytes, and clients send a non-ASCII key in one encoding
        # or another (UTF-8, Latin-1): refused here rather than never matching
        raise InvalidInput("the API key must be non-empty printable ASCII without spaces")
    if o.prefill_chunk is not None and not 1 <= o.prefill_chunk <= MAX_PREFILL_CHUNK:
        raise InvalidInput(f"--prefill-chunk must be between 1 and {MAX_PREFILL_CHUNK} tokens")
    if o.body_limit < 1024:
        raise InvalidInput("--body-limit must be at least 1024 bytes")
    if not 0 <= o.grace <= 3600:
        raise InvalidInput("--grace must be between 0 and 3600 seconds")
    check_threads(o.threads)


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        raise IOFailure(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.set_inheritable(True)
    return sock


def serve(store: Store, o: ServeOptions, log=stderr_log) -> None:
    """Run until SIGTERM/SIGINT (then exit 0); a refused option or port raises its SlmError."""
    check(o)
    # threads, the mode and the memory budget (the flag, else config.toml's) checked here too
    runtime = Runtime(store, threads=o.threads, exact=o.exact, memory_budget=o.memory_budget)
    import uvicorn

    sock = bind(o.host, o.port)  # before anything slow: a taken port fails at once, in one line
    metrics = Metrics()
    follower = None
    if o.follow is not None:
        follower = Follower(store, o.follow, insecure=o.insecure, interval=o.follow_interval, metrics=metrics, log=log)
        try:  # a bad REF or interval, another follower of the store: refused before anything is served
            follower.start()
        except BaseException:
            sock.close()
            raise
    catalog = Catalog(runtime, log=log)
    catalog.on_switch = metrics.record_switch
    catalog.start()  # stages what is active now (a failure is logged; the server still starts)
    scheduler = runtime.scheduler(o.max_batch, 4 * o.max_batch if o.max_queue is None else o.max_queue,
                                  o.prefill_chunk, metrics, log)
    scheduler.start()
    app = build_app(catalog, scheduler, metrics, api_key=o.api_key, body_limit=o.body_limit, log=log)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if not scheduler.draining:  # the first signal starts the drain
                log(f"{signal.Signals(sig).name}: no new requests; {scheduler.busy()} running get up to "
                    f"{o.grace:g} s")
                scheduler.drain()
                if follower is not None:
                    follower.stop()
                # then cancel what is left, leaving the last part of the grace period (up to 1 s)
                # for the streams to end and the process to exit
                timer = threading.Timer(o.grace - min(1.0, o.grace / 4), scheduler.request_stop)
                timer.daemon = True
                timer.start()
                threading.Thread(target=self.exit_when_idle, args=(sig, frame), name="slm-drain", daemon=True).start()
            else:
                # a second signal cancels at once. Not passed on to uvicorn: its forced exit
                # cancels the handlers mid-request (a plain-text 500 and a traceback each)
                # where the scheduler's cancel lets each of them answer
                scheduler.request_stop()

        def exit_when_idle(self, sig, frame) -> None:
            """uvicorn's shutdown (it stops listening) once no request runs (nor a follower's round)
            or the grace period is out: until then the port answers, /health with 503."""
            deadline = time.monotonic() + o.grace
            while (scheduler.busy() or (follower is not None and follower.running())) and time.monotonic() < deadline:
                time.sleep(DRAIN_POLL_S)
            super().handle_exit(sig, frame)

        async def startup(self, sockets=None):
            await super().startup(sockets)
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    active = catalog.active
                    log(f"listening on http://{host}:{port} (active: {active.id if active else 'none'}; "
                        f"mode {runtime.mode}; max batch {o.max_batch}"
                        f"{', API key required' if o.api_key else ''}"
                        f"{'; following ' + o.follow if o.follow else ''})")

    config = uvicorn.Config(app, host=o.host, port=o.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=STRAGGLER_S, lifespan="off")
    # uvicorn re-raises the signal after its shutdown: with Python handlers in place that is a
    # no-op, and the process exits 0 instead of dying by the signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        Server(config).run(sockets=[sock])
    finally:
        scheduler.stop()
        catalog.stop()
        if follower is not None:
            follower.stop()
            if follower.running():  # past the grace period: ended with the process, as a kill ends it
                log(f"follow {o.follow}: the round in progress is abandoned; the next start resumes it")
    log("stopped")
