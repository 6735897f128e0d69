"""`slm run` and `slm serve` are one engine: the same greedy request gives the same answer and
the same stop reason from the command line (`slm run --json`) and over HTTP, a max_tokens past
the context is refused by both with the same message (and a request that gives none is
lowered to what the context leaves by both), and a forced tool call comes back the same."""

from __future__ import annotations

import json

import pytest

from helpers import tiny_store
from serve_helpers import Server
from tool_schemas import QWEN_STYLE_TEMPLATE, TOOLS, tiny_hf_with_template

from slm import ExitCode
from slm.server.responses import finish_reason, tool_finish

CONTEXT = 256  # the tiny model's (scripts/tiny_common.py)


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_model):
    """tq (the tiny model, ChatML) and qt (the same with a Qwen-style tool template and a longer
    context)."""
    root = tmp_path_factory.mktemp("parity")
    hf = tiny_hf_with_template(tiny_model, root / "hf-tools", QWEN_STYLE_TEMPLATE)
    return tiny_store(root, tiny_model, bases={"tq": "gguf_q"}, steps=(("import", "base", hf, "--name", "qt"),
                                                                       ("activate", "tq")))


@pytest.fixture(scope="module")
def server(store):
    srv = Server(store, "--threads", "1")
    yield srv
    assert srv.stop() == 0


def _run(cli, store, *args):
    r = cli("--store", store, "run", *args, "--threads", "1", "--json")
    return r.code, (json.loads(r.out) if r.code == 0 else r.err)


def test_a_greedy_completion_is_the_same_answer_with_the_same_reason(cli, store, server):
    for prompt, max_tokens in (("Once upon a time", 12), ("the cat sat on the", 40)):
        code, ran = _run(cli, store, prompt, "--base", "tq", "--max-tokens", str(max_tokens))
        status, served = server.json("POST", "/v1/completions", {"model": "tq", "prompt": prompt,
                                                                 "max_tokens": max_tokens})
        assert (code, status) == (0, 200), (ran, served)
        choice = served["choices"][0]
        assert choice["text"] == ran["text"] and choice["finish_reason"] == finish_reason(ran["stop_reason"])
        assert served["usage"]["completion_tokens"] == len(ran["tokens"])


def test_max_tokens_past_the_context_is_refused_alike_and_a_default_lowered_alike(cli, store, server):
    prompt = "word " * 90  # most of the 256 positions: fewer than 128 left
    code, ran = _run(cli, store, prompt, "--base", "tq", "--max-tokens", str(CONTEXT))
    status, served = server.json("POST", "/v1/completions", {"model": "tq", "prompt": prompt, "max_tokens": CONTEXT})
    assert (code, status) == (ExitCode.INVALID_INPUT, 400)
    assert "past the context" in ran and served["error"]["message"] in ran
    # no max_tokens: 128, lowered to what the context leaves, by both
    code, ran = _run(cli, store, prompt, "--base", "tq")
    status, served = server.json("POST", "/v1/completions", {"model": "tq", "prompt": prompt})
    assert (code, status) == (0, 200), (ran, served)
    choice = served["choices"][0]
    assert choice["text"] == ran["text"] and choice["finish_reason"] == finish_reason(ran["stop_reason"])
    assert len(ran["prompt_tokens"]) + len(ran["tokens"]) <= CONTEXT


def test_a_forced_tool_call_is_the_same_call(cli, store, server, tmp_path):
    ask = "what is the weather in paris?"
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    code, ran = _run(cli, store, ask, "--base", "qt", "--tools", tools, "--tool-choice", "get_weather",
                     "--max-tokens", "120")
    status, served = server.json("POST", "/v1/chat/completions", {
        "model": "qt", "messages": [{"role": "user", "content": ask}], "tools": TOOLS, "max_tokens": 120,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert (code, status) == (0, 200), (ran, served)
    message, reason = served["choices"][0]["message"], served["choices"][0]["finish_reason"]
    assert ran["tool_calls"] and [(c["name"], c["arguments"]) for c in ran["tool_calls"]] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert (message["content"] or "") == ran["text"]
    assert reason == tool_finish(finish_reason(ran["stop_reason"]), tuple(ran["tool_calls"]))
