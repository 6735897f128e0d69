"""The dialect of vLLM-compatible routers and clients (issue 46): the fields vllm-router writes
into every body it forwards, and vLLM's own request fields, each with vLLM's meaning or refused
by name; a misspelled one stays a 400. On the tiny model, through a real `slm serve`."""

from __future__ import annotations

import pytest

from helpers import copy_store, tiny_store
from serve_helpers import Server

pytest.importorskip("uvicorn")

PROMPT = "the cat sat on"
# What vllm-router 0.1.17 forwards for a plain {"model", "prompt", "max_tokens"} (recorded from
# the router in front of a recording backend): its own defaults written into the body.
ROUTER_COMPLETIONS = {"stream": False, "echo": False, "no_stop_trim": False, "ignore_eos": False,
                      "skip_special_tokens": True, "return_hidden_states": False}
ROUTER_CHAT = {"stream": False, "logprobs": False, "no_stop_trim": False, "ignore_eos": False,
               "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
               "stream_reasoning": True, "return_hidden_states": False, "include_reasoning": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model):
    root = copy_store(tiny_store(tmp_path_factory.mktemp("vllm-fields"), tiny_model),
                      tmp_path_factory.mktemp("served"))
    running = Server(root, "--threads", "1", "--max-batch", "4")
    yield running
    assert running.stop() == 0
    assert not any("Traceback" in line for line in running.lines), "\n".join(running.lines)


def _complete(server, **fields) -> tuple[int, dict]:
    return server.json("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, **fields})


def test_the_routers_body_is_answered_as_the_plain_request(server):
    status, plain = _complete(server)
    assert status == 200, plain
    status, routed = _complete(server, **ROUTER_COMPLETIONS)
    assert status == 200, routed
    assert routed["choices"][0]["text"] == plain["choices"][0]["text"]


@pytest.mark.parametrize("no_stop_trim", [True, False])
def test_no_stop_trim_gives_vllms_answer_the_stop_sequence_trimmed(server, no_stop_trim):
    """vLLM has no no_stop_trim (SGLang's, which the router inherits): it ignores the field, so
    its answer ends before the stop sequence whatever the value."""
    status, plain = _complete(server)
    text = plain["choices"][0]["text"]
    stop = text[len(text) // 2:][:3]
    assert stop.strip(), text  # (a stop sequence inside the greedy answer)
    status, body = _complete(server, stop=[stop], no_stop_trim=no_stop_trim)
    assert status == 200, body
    assert body["choices"][0]["text"] == text[:text.index(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("fields, message", [
    ({"no_stop_trimm": True}, "unknown field: no_stop_trimm"),
    ({"return_hidden_states": True}, "unsupported field: return_hidden_states"),
])
def test_a_misspelled_or_unimplemented_field_is_a_400_naming_it(server, fields, message):
    status, body = _complete(server, **fields)
    assert status == 400
    assert message in body["error"]["message"]


def test_the_routers_chat_body_parses_as_the_plain_request():
    from slm.server.protocol import parse_request

    messages = [{"role": "user", "content": "hi"}]
    routed = parse_request({"messages": messages, "max_tokens": 3, **ROUTER_CHAT}, chat=True)
    assert routed == parse_request({"messages": messages, "max_tokens": 3}, chat=True)
