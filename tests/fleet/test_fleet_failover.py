"""One `slm serve` replica of three goes away while 8 streams run through vLLM's router
(round_robin), killed (kill -9) or stopped (SIGTERM, as a rolling update stops it): no stream
hangs past its deadline, none is cut without an error, the two other replicas keep answering,
and the restarted replica rejoins once the router's health check re-admits it. Stopped, the
replica drains: every stream completes. Killed, its streams fail, visibly.

What a client sees of a cut stream: vllm-router relays the replica's server-sent events as they
come, and when the replica's connection dies it ends its own response without the chunked
encoding's last chunk and without an SSE error event. The openai client (httpx) raises on that
("incomplete chunked read"), so the cut is visible; a client that takes a closed connection for
the end of the stream would not know. Either way the stream has no `data: [DONE]` and no
finish_reason, which is what this test counts as the mark of an answer that ended."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from fleet_fixtures import REQUEST_S, fleet, openai_client  # noqa: F401  (fixture)

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.real_model, pytest.mark.slow]

STREAMS = 8
# Greedy counting goes on to max_tokens: every stream is still running when the replica dies.
COUNT = [{"role": "user", "content": "Count from 1 to 500, separated by commas."}]
STREAM_TOKENS = 400
READ_TIMEOUT_S = 60  # no byte for this long: the stream hung
DEADLINE_S = 300  # every stream has ended, one way or another, by then (else: it hung)


def _stream(url: str, started: threading.Barrier, outcomes: list) -> None:
    """One streamed chat through the router; its outcome appended: ("completed" | "failed" |
    "hung" | "truncated", detail)."""
    client = openai_client(url, timeout=READ_TIMEOUT_S)
    finish, tokens, first = None, 0, True
    try:
        for chunk in client.chat.completions.create(model="active", messages=COUNT, max_tokens=STREAM_TOKENS,
                                                    stream=True):
            if first:
                first = False
                started.wait()
            for choice in chunk.choices:
                tokens += bool(choice.delta.content)
                finish = choice.finish_reason or finish
    except Exception as err:  # any error the client raises is visible: counted, its text kept
        # a read timeout (the client's, or its transport's raised as is mid-stream) is a hang
        hung = isinstance(err, openai.APITimeoutError) or "Timeout" in type(err).__name__
        outcomes.append(("hung" if hung else "failed", f"after {tokens} chunks: {err!r} (from {err.__cause__!r})"))
    else:
        outcomes.append(("completed", finish) if finish else ("truncated", f"ended after {tokens} chunks"))
    finally:
        if first:  # never got a first chunk: the barrier must not wait for this stream
            started.abort()


def _short(client) -> str:
    return client.completions.create(model="active", prompt="The capital of France is", max_tokens=4).choices[0].text


class Streams:
    """STREAMS streamed chats through a router, each on a thread of its own; started once every
    stream has its first chunk."""

    def __init__(self, url: str):
        self.outcomes: list = []
        started = threading.Barrier(STREAMS + 1, timeout=REQUEST_S)
        self.threads = [threading.Thread(target=_stream, args=(url, started, self.outcomes), daemon=True)
                        for _ in range(STREAMS)]
        for t in self.threads:
            t.start()
        started.wait()

    def ended(self, what: str) -> dict:
        """Every stream's outcome once each has ended or the deadline passed; counted and printed."""
        deadline = time.monotonic() + DEADLINE_S
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.outcomes += [("hung", "still running at the deadline")] * sum(t.is_alive() for t in self.threads)
        counts = {kind: sum(1 for k, _ in self.outcomes if k == kind)
                  for kind in ("completed", "failed", "hung", "truncated")}
        print(f"\n{what}; streams: {counts}")
        for kind, detail in self.outcomes:
            if kind != "completed":
                print(f"  {kind}: {detail}")
        assert counts["hung"] == 0 and counts["truncated"] == 0, self.outcomes
        assert {d for k, d in self.outcomes if k == "completed"} <= {"length"}, self.outcomes
        return counts


def _busiest(fleet) -> tuple[int, list[int]]:  # noqa: F811
    """(the replica with the most rows in flight, each replica's rows): every stream is in flight."""
    running = [r.load() for r in fleet.replicas]
    assert sum(running) == STREAMS, running
    return max(range(len(running)), key=running.__getitem__), running


def _rejoins(fleet, router, victim: int) -> None:  # noqa: F811
    """The replica restarted on its port (the router still lists that URL) is re-admitted by the
    router's health check and answers again; nothing is left in flight anywhere."""
    replica = fleet.replicas[victim]
    replica.start()
    router.wait_healthy(REQUEST_S)
    client = openai_client(router.url)
    after = [_short(client) for _ in range(6)]
    assert all(text.strip() for text in after), after
    assert replica.requests_served() > 0  # round robin reached the restarted replica
    assert [r.load() for r in fleet.replicas] == [0] * len(fleet.replicas)


def test_kill_9_of_a_replica_during_8_streams(fleet):  # noqa: F811
    router = fleet.router("round_robin")
    try:
        streams = Streams(router.url)
        victim, running = _busiest(fleet)
        fleet.replicas[victim].kill()
        client = openai_client(router.url)
        during = [_short(client) for _ in range(6)]  # the router retries elsewhere; the others answer
        assert all(text.strip() for text in during), during
        counts = streams.ended(f"running per replica at the kill {running}, killed replica {victim}")
        cut = running[victim]  # the streams the killed replica was serving, each failed visibly
        assert counts["failed"] == cut and counts["completed"] == STREAMS - cut, (running, streams.outcomes)
        _rejoins(fleet, router, victim)
    finally:
        router.stop()


def test_sigterm_of_a_replica_during_8_streams_loses_nothing(fleet):  # noqa: F811
    """A rolling update's stop: the replica drains (its /health 503 takes it out of the router's
    rotation; a request sent to it meanwhile is a 503 the router retries elsewhere), finishes its
    streams within --grace and exits 0: every stream completes, every request is answered."""
    router = fleet.router("round_robin")
    try:
        streams = Streams(router.url)
        victim, running = _busiest(fleet)
        server = fleet.replicas[victim].server
        server.proc.send_signal(signal.SIGTERM)
        client = openai_client(router.url)
        during = [_short(client) for _ in range(6)]
        assert all(text.strip() for text in during), during
        counts = streams.ended(f"running per replica at SIGTERM {running}, stopped replica {victim}")
        assert counts["completed"] == STREAMS, streams.outcomes
        assert server.proc.wait(timeout=REQUEST_S) == 0
        _rejoins(fleet, router, victim)
    finally:
        router.stop()
