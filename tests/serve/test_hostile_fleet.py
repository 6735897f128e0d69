"""The fleet-serving surfaces (issue 46) attacked as a hostile client or peer would: vLLM's
request fields, the tokenizer endpoints, /metrics, /v1/models. One real server on the tiny
base `tq` with tq + a1@0.5 active (its log lines kept by serve_helpers.Server)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from urllib.parse import urlparse

import pytest

from helpers import copy_store, tiny_store
from serve_helpers import Server

pytest.importorskip("uvicorn")
pytestmark = pytest.mark.hostile


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("fleet")
    template = tiny_store(root / "template", tiny_model, adapters=1, steps=(("activate", "tq", "a1@0.5"),))
    srv = Server(copy_store(template, root), "--threads", "1")
    yield srv
    assert srv.stop() == 0


def _log_since(server, start: int) -> list[str]:
    """The server's log lines from line `start` on, up to and including the log line of a
    /health request made now (a request's line is written once its response is sent)."""
    server.http("GET", "/health")
    deadline = time.monotonic() + 30
    while not any("GET /health" in line for line in server.lines[start:]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return server.lines[start:]


@pytest.mark.parametrize("field, penalty", [("repetition_penalty", 1e-40), ("repetition_penalty", 1e-320),
                                            ("repeat_penalty", 1e-320), ("repetition_penalty", 1e308)])
def test_an_extreme_repetition_penalty_is_an_answer_not_a_500(server, field, penalty):
    """A penalty the range check accepts (a finite number > 0) took a seen token's logit past
    float32's range: +inf on two tokens, NaN probabilities, HTTP 500 and numpy's warnings in the
    log. The penalised logits stay finite: a sampled answer, as vLLM gives one."""
    start = len(server.lines)
    code, doc = server.json("POST", "/v1/completions", {"prompt": "hi hi hi", "max_tokens": 6, "temperature": 0.7,
                                                        "seed": 3, field: penalty})
    assert code == 200, doc
    assert doc["choices"][0]["finish_reason"] in ("length", "stop")
    assert doc["usage"]["completion_tokens"] >= 1
    assert not [line for line in _log_since(server, start) if "Warning" in line or not line.startswith("slm serve:")]


def test_a_path_cannot_forge_a_log_line(server):
    """A percent-encoded line break in the path was written raw into the one-line-per-request
    log: the client wrote a line of its own (`slm serve: FAKE ...`) and raw bytes (%00)."""
    start = len(server.lines)
    url = urlparse(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("GET", "/v1/models/x%0Aslm%20serve:%20FAKE%00%0D%E2%80%A8")
        response = conn.getresponse()
        response.read()
    finally:
        conn.close()
    assert response.status == 404
    lines = [line for line in _log_since(server, start) if "FAKE" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("slm serve: GET /v1/models/x\\nslm serve: FAKE\\x00\\r\\u2028 404"), lines


def test_a_weight_padded_to_a_megabyte_is_refused_not_carried_into_every_label(server):
    """`tq+a1@0.5000...` (200,000 zeros) is the active composition's own weight, so it ran, and
    its name, as requests name it, was carried whole: into every streamed chunk's `model` and
    into /metrics' vllm:lora_requests_info label, which every router scrapes (12 such requests:
    a 2.4 MB /metrics). A weight is written in at most 32 characters: 400, naming it."""
    padded = "tq+a1@0.5" + "0" * 200_000
    for path, body in (("/v1/completions", {"model": padded, "prompt": "hi", "max_tokens": 2}),
                       ("/tokenize", {"model": padded, "prompt": "hi"})):
        code, doc = server.json("POST", path, body)
        assert code == 400, (path, code)
        message = doc["error"]["message"]
        assert "weight" in message and "32" in message and len(message) < 300, message
    code, doc = server.json("POST", "/v1/completions", {"model": "tq+a1@0.50000", "prompt": "hi", "max_tokens": 2})
    assert code == 200 and doc["model"] == "tq+a1@0.50000", doc


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_name_a_special_token_as_the_answer_writes_it(server, stream):
    """skip_special_tokens false puts an end-of-turn token's text (`<|im_end|>`, forced here by
    logit_bias with ignore_eos) in the answer, but its logprobs named it "": the tokens no
    longer added up to the text, and text_offset pointed past it. They name it as the text does."""
    body = {"prompt": "hi", "max_tokens": 3, "temperature": 0, "ignore_eos": True, "logit_bias": {"2": 100},
            "skip_special_tokens": False, "logprobs": 1, "stream": stream}
    status, _, data = server.http("POST", "/v1/completions", body)
    assert status == 200, data
    if stream:
        chunks = [json.loads(line[len(b"data: "):]) for line in data.splitlines()
                  if line.startswith(b"data: {")]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        tokens = [t for c in chunks if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]]
    else:
        choice = json.loads(data)["choices"][0]
        text, tokens = choice["text"], choice["logprobs"]["tokens"]
        assert choice["logprobs"]["text_offset"] == [0, len("<|im_end|>"), 2 * len("<|im_end|>")]
    assert text == "<|im_end|>" * 3
    assert tokens == ["<|im_end|>"] * 3


CHAT_HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("fields", [{"stop_token_ids": [99999]}, {"logit_bias": {"99999": 1}}, {"max_tokens": 100000},
                                    {"n": 9}, {"seed": 2**63 - 1, "n": 2},
                                    {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                                "schema": {"$ref": "#"}}}}],
                         ids=["stop-id", "bias-id", "max-tokens", "n", "seed-n", "schema"])
def test_a_render_refuses_what_its_completion_refuses(server, fields):
    """/v1/chat/completions/render checked the body alone: ids outside the vocabulary, a
    max_tokens past the context, n over --max-batch, seed + n past the seeds, a schema that
    accepts nothing all rendered 200 with those sampling parameters, where the completion
    itself answers 400. The render is checked as its completion is (docs/serve.md, Tokens)."""
    body = {"messages": CHAT_HI, **fields}
    code, completion = server.json("POST", "/v1/chat/completions", body)
    assert code == 400, completion
    code, render = server.json("POST", "/v1/chat/completions/render", body)
    assert code == 400 and render["error"]["message"] == completion["error"]["message"], render
    code, listed = server.json("POST", "/v1/completions/render", {"prompt": "hi", **fields})
    assert code == 400, listed


def test_a_render_reports_the_max_tokens_its_answer_may_run_to(server):
    render = server.json("POST", "/v1/chat/completions/render", {"messages": CHAT_HI})[1]
    assert render["sampling_params"]["max_tokens"] == 128  # the completion's default, not null
    given = server.json("POST", "/v1/chat/completions/render", {"messages": CHAT_HI, "max_tokens": 8})[1]
    assert given["sampling_params"]["max_tokens"] == 8


@pytest.mark.parametrize("damage", [b"blake3:zzzz", b"x" * 5000, b"\xff\xfe", "fifo"],
                         ids=["not-a-digest", "oversized", "binary", "fifo"])
def test_one_damaged_tag_does_not_take_the_model_list_down(tmp_path, tiny_model, damage):
    """A tag file with garbage in it (store damage: a torn disk, a hand edit) made Store.ls
    raise, so `slm ls` failed as a whole (exit 5) and the server's /v1/models and every
    /v1/models/{id} answered 500: one bad name hid every model from every client and router.
    The damaged name is listed with its error (`slm ls`), left out of /v1/models; the rest answer."""
    from slm.cli import run

    store = tiny_store(tmp_path, tiny_model, adapters=1, steps=(("activate", "tq", "a1@0.5"), ("tag", "good", "@active"),
                                                                ("tag", "bad", "tq")))
    bad = store / "names" / "tags" / "bad"
    if damage == "fifo":  # (read without waiting for a writer: damage, never a hang)
        bad.unlink()
        os.mkfifo(bad)
    else:
        bad.write_bytes(damage)
    srv = Server(store, "--threads", "1")
    try:
        code, doc = srv.json("GET", "/v1/models")
        assert code == 200, doc
        ids = [m["id"] for m in doc["data"]]
        assert {"active", "good", "tq", "tq+a1@0.5"} <= set(ids) and "bad" not in ids, ids
        code, doc = srv.json("GET", "/v1/models/good")
        assert code == 200 and doc["slm"]["kind"] == "tag", doc
    finally:
        assert srv.stop() == 0
    listed = subprocess.run([sys.executable, "-m", "slm", "--store", str(store), "ls", "--json"], capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    entries = {(e["kind"], e["name"]): e for e in json.loads(listed.stdout)}
    assert "slm fsck" in entries["tag", "bad"]["error"] and entries["tag", "bad"]["digest"] is None
    assert "error" not in entries["tag", "good"] and entries["tag", "good"]["active"] is True
    assert run(["--store", str(store), "fsck"]) == 5  # still damage, for the operator to decide


def test_the_open_paths_tell_the_active_composition_to_a_client_with_the_key_only(tmp_path, tiny_model):
    """/health and /get_load answer without the API key (a router's probes carry none), but
    their slm-composition header told every keyless client the active composition's id, which
    every other endpoint tells a client with the key only (a 401's header is empty)."""
    store = tiny_store(tmp_path, tiny_model)
    srv = Server(store, "--threads", "1", "--api-key", "sekrit")
    try:
        for path in ("/health", "/get_load"):
            status, headers, _ = srv.http("GET", path)
            assert status == 200 and not headers.get("slm-composition"), (path, headers)
            status, headers, _ = srv.http("GET", path, headers={"Authorization": "Bearer wrong"})
            assert status == 200 and not headers.get("slm-composition"), (path, headers)
            status, headers, _ = srv.http("GET", path, headers={"Authorization": "Bearer sekrit"})
            assert status == 200 and headers["slm-composition"].startswith("blake3:"), (path, headers)
    finally:
        assert srv.stop() == 0


def test_a_body_that_stops_arriving_is_a_408_not_a_request_held_open(server):
    """A client (or a broken router) that announces a body and stops sending half-way held its
    connection and its request open for ever: the server waited for the rest with no deadline.
    It gets 408 once the body's deadline (10 s, plus a second per 16 KiB received) is past."""
    url = urlparse(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=60) as conn:
        conn.sendall(b"POST /tokenize HTTP/1.1\r\nHost: slm\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        answer = b""
        while b"\r\n\r\n" not in answer:
            piece = conn.recv(4096)  # (within the socket's 60 s: a server that waits for ever fails here)
            assert piece, answer
            answer += piece
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert server.json("POST", "/tokenize", {"prompt": "hi"})[0] == 200


def test_an_oversized_body_that_never_arrives_still_gets_its_413(server):
    """Content-Length over the limit and no body: the 413 waited for the body it drains first
    (so that a client still sending reads the 413), with no deadline: for ever."""
    url = urlparse(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=60) as conn:
        conn.sendall(b"POST /tokenize HTTP/1.1\r\nHost: slm\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 99999999\r\n\r\n")
        answer = conn.recv(4096)  # (within the socket's 60 s)
    assert answer.startswith(b"HTTP/1.1 413"), answer
