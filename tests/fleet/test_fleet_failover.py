"""kill -9 of one `slm serve` replica while 8 streams run through vLLM's router (round_robin):
no stream hangs past its deadline, none is cut without an error, the two other replicas keep
answering, and the restarted replica rejoins once the router's health check re-admits it.

What a client sees of a cut stream: vllm-router relays the replica's server-sent events as they
come, and when the replica's connection dies it ends its own response without the chunked
encoding's last chunk and without an SSE error event. The openai client (httpx) raises on that
("incomplete chunked read"), so the cut is visible; a client that takes a closed connection for
the end of the stream would not know. Either way the stream has no `data: [DONE]` and no
finish_reason, which is what this test counts as the mark of an answer that ended."""

from __future__ import annotations

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


def test_kill_9_of_a_replica_during_8_streams(fleet):  # noqa: F811
    router = fleet.router("round_robin")
    try:
        outcomes: list = []
        started = threading.Barrier(STREAMS + 1, timeout=REQUEST_S)
        threads = [threading.Thread(target=_stream, args=(router.url, started, outcomes), daemon=True)
                   for _ in range(STREAMS)]
        for t in threads:
            t.start()
        started.wait()  # every stream has its first chunk
        running = [r.load() for r in fleet.replicas]  # rows in flight on each replica
        assert sum(running) == STREAMS, running
        victim = max(range(len(running)), key=running.__getitem__)
        cut = running[victim]
        fleet.replicas[victim].kill()

        client = openai_client(router.url)
        during = [_short(client) for _ in range(6)]  # the router retries elsewhere; the others answer
        assert all(text.strip() for text in during), during

        deadline = time.monotonic() + DEADLINE_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        outcomes += [("hung", "still running at the deadline")] * sum(t.is_alive() for t in threads)
        counts = {kind: sum(1 for k, _ in outcomes if k == kind) for kind in ("completed", "failed", "hung",
                                                                              "truncated")}
        print(f"\nrunning per replica at the kill {running}, killed replica {victim}; streams: {counts}")
        for kind, detail in outcomes:
            if kind != "completed":
                print(f"  {kind}: {detail}")
        assert counts["hung"] == 0 and counts["truncated"] == 0, outcomes
        assert counts["failed"] == cut and counts["completed"] == STREAMS - cut, (running, outcomes)
        assert {d for k, d in outcomes if k == "completed"} == {"length"}

        replica = fleet.replicas[victim]
        replica.start()  # on its port: the router still lists that URL
        router.wait_healthy(REQUEST_S)  # its health check re-admitted the replica
        after = [_short(client) for _ in range(6)]
        assert all(text.strip() for text in after), after
        assert replica.requests_served() > 0  # round robin reached the restarted replica
        assert [r.load() for r in fleet.replicas] == [0] * len(fleet.replicas)  # nothing left in flight
    finally:
        router.stop()
