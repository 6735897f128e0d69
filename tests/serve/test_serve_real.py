"""`slm serve` on the real SmolLM2-135M-Instruct: the openai client against `slm run --chat`,
a client that goes away, a full server, and SIGTERM during four streams."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from urllib.parse import urlparse

import pytest

from helpers import HANG_S, wait_until
from serve_helpers import Server

pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytestmark = pytest.mark.real_model

ROOT_ADAPTERS = __import__("pathlib").Path(__file__).resolve().parents[2] / "fixtures" / "demo_adapters"
PROMPT = "What is the capital of France?"


@pytest.fixture
def smol_store(cli, store, store_dir, smollm2_gguf):
    assert cli("import", "base", smollm2_gguf, "--name", "smol").code == 0
    assert cli("import", "adapter", ROOT_ADAPTERS / "pirate", "--name", "pirate").code == 0
    return store_dir


def test_openai_chat_equals_slm_run_chat(cli, smol_store):
    """chat.completions.create on model="active" gives the text of `slm run --chat` on the same
    composition (greedy), streamed and not; the composition is named in system_fingerprint and
    in the slm-composition header."""
    r = cli("activate", "smol", "pirate@0.8", "--json")
    comp_id = r.json()["active"]["id"]
    r = cli("run", "--chat", PROMPT, "-n", "24", "--json")
    assert r.code == 0, r.err
    expected = r.json()["text"]
    server = Server(smol_store, "--threads", "1")
    try:
        client = server.client()
        messages = [{"role": "user", "content": PROMPT}]
        raw = client.chat.completions.with_raw_response.create(model="active", messages=messages, max_tokens=24)
        assert raw.headers["slm-composition"] == comp_id
        reply = raw.parse()
        assert reply.choices[0].message.content == expected
        assert reply.system_fingerprint == comp_id
        chunks = list(client.chat.completions.create(model="active", messages=messages, max_tokens=24,
                                                     stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
        assert {c.system_fingerprint for c in chunks} == {comp_id}
    finally:
        assert server.stop() == 0


def _stream_lines(url: str, body: dict, timeout: float = 120):
    """A raw streaming request: (connection, response) to read SSE lines from."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def _finish_reason(lines: list[bytes]) -> str | None:
    """The finish_reason of a stream's last chunk that has one."""
    reasons = [choice.get("finish_reason") for line in lines if line.startswith(b"data: {")
               for choice in json.loads(line[len(b"data: "):]).get("choices", [])]
    return next((r for r in reversed(reasons) if r), None)


def test_disconnect_full_server_and_sigterm_during_streams(cli, smol_store, capsys):
    """A client that closes its stream is cancelled at the next step; with 4 requests running
    and no queue a fifth gets 429 with Retry-After; SIGTERM while 4 streams run makes the
    process stop admitting, cancel the 4 when the grace period runs out, end every stream and
    exit 0. The greedy story never stops by itself before its 1000 tokens (`slm run` says
    "length"): only the cancellation can end the streams. The events are asserted, not the
    time they took (printed; the wait has a limit that only catches a hang)."""
    assert cli("activate", "smol").code == 0
    grace = 3.0
    server = Server(smol_store, "--threads", "1", "--max-batch", "4", "--max-queue", "0", "--grace", str(grace))
    long = {"messages": [{"role": "user", "content": "Tell me a very long story about a dragon."}],
            "max_tokens": 1000, "stream": True}
    try:
        conn, resp = _stream_lines(server.url, long)
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
        conn.close()  # the client goes away mid-stream
        # the cancellation counted, then nothing running: "running 0" alone is no proof, the
        # first token reaches the client before its request joins the running batch
        wait_until(lambda: b"slm_cancelled_requests_total 1.0" in server.http("GET", "/metrics")[2],
                   "the abandoned stream's cancellation")
        wait_until(lambda: server.status()["running"] == 0, "an empty batch after the cancellation")

        ended, started = [], threading.Barrier(5, timeout=120)

        def stream() -> None:
            conn, resp = _stream_lines(server.url, long)
            assert resp.status == 200
            first = resp.readline()
            started.wait()
            lines = [first]
            for _ in range(100_000):  # bounded: the server ends the stream
                line = resp.readline()
                if not line:
                    break
                lines.append(line)
            ended.append((b"data: [DONE]" in b"".join(lines), _finish_reason(lines)))
            conn.close()

        threads = [threading.Thread(target=stream) for _ in range(4)]
        for t in threads:
            t.start()
        started.wait()
        status, headers, body = server.http("POST", "/v1/chat/completions", {**long, "stream": False})
        assert status == 429 and headers.get("retry-after") == "1", body
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=HANG_S)  # only a hang takes this long
        elapsed = time.monotonic() - sent
        for t in threads:
            t.join(timeout=HANG_S)
    finally:
        if server.proc.poll() is None:
            server.stop(signal.SIGKILL)
    assert code == 0, "\n".join(server.lines)
    assert not any("Traceback" in line for line in server.lines), "\n".join(server.lines)
    wait_until(lambda: server.lines and server.lines[-1].endswith("stopped"), "the server's last log line")
    # SIGTERM came while the 4 ran (the drain began), and "stopped" is the server's last word
    assert any("SIGTERM: no new requests; 4 running" in line for line in server.lines), "\n".join(server.lines)
    assert ended == [(True, "cancelled")] * 4, ended  # cut by the grace period, each stream ended
    with capsys.disabled():
        print(f"\nSIGTERM with 4 streams running: exit 0 after {elapsed:.2f} s (grace {grace:g} s)")


def test_sigterm_answers_health_503_at_once_while_a_running_request_finishes(cli, smol_store):
    """From SIGTERM on, /health answers 503 (a router stops sending) and a new request 503,
    while the server keeps listening for as long as a request runs; that request, within the
    grace period, ends by itself (finish_reason "length", not cancelled); then the server stops
    listening and exits 0. (Before: /health answered 200 {"status": "draining"}, or nothing at
    all once uvicorn had closed its socket.)"""
    assert cli("activate", "smol").code == 0
    eos = sorted(__import__("slm").Store.open(smol_store).tokenizer("smol").eos_ids)
    server = Server(smol_store, "--threads", "1", "--grace", "600")  # the grace never cuts it
    assert server.http("GET", "/health")[:1] == (200,)
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 400, "stream": True,
            "logit_bias": {str(e): -100 for e in eos}}  # it runs its 400 tokens
    try:
        conn, resp = _stream_lines(server.url, body)
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
        server.proc.send_signal(signal.SIGTERM)
        code, health = wait_until(lambda: (lambda r: r if r[0] == 503 else None)(server.json("GET", "/health")),
                                  "/health answering 503")
        assert health == {"status": "draining"}
        status = server.status()  # still listening, and the request still runs
        assert status["draining"] and status["running"] + status["prefilling"] == 1, status
        code, refused = server.json("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1})
        assert code == 503 and refused["error"]["type"] == "unavailable", refused
        lines = []
        for _ in range(100_000):  # bounded: the server ends the stream
            lines.append(resp.readline())
            if not lines[-1]:
                break
        conn.close()
        assert b"data: [DONE]\n" in lines and _finish_reason(lines) == "length"
        assert server.proc.wait(timeout=HANG_S) == 0, "\n".join(server.lines)
    finally:
        if server.proc.poll() is None:
            server.stop(signal.SIGKILL)
    assert not any("Traceback" in line for line in server.lines), "\n".join(server.lines)
    with pytest.raises(ConnectionError):  # stopped listening
        http.client.HTTPConnection(urlparse(server.url).hostname, urlparse(server.url).port, timeout=5).connect()
