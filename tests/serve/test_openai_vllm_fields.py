"""The dialect of vLLM-compatible routers and clients (issue 46): the fields vllm-router writes
into every body it forwards, and vLLM's own request fields, each with vLLM's meaning or refused
by name; a misspelled one stays a 400. On the tiny model, through a real `slm serve`."""

from __future__ import annotations

import json

import pytest

import slm
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
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("vllm-fields"), tiny_model)


@pytest.fixture(scope="module")
def tok(template):
    return slm.Store.open(template).tokenizer("tq")


@pytest.fixture(scope="module")
def server(template, tmp_path_factory):
    root = copy_store(template, tmp_path_factory.mktemp("served"))
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
    ({"lora_path": "a1"}, "unsupported field: lora_path (slm does not implement it"),
    ({"chat_template_kwargs": {"enable_thinking": False}}, "unsupported field: chat_template_kwargs"),
])
def test_a_misspelled_or_unimplemented_field_is_a_400_naming_it(server, fields, message):
    status, body = _complete(server, **fields)
    assert status == 400
    assert message in body["error"]["message"]


def _chat(server, messages, **fields) -> tuple[int, dict]:
    return server.json("POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 12, **fields})


USER = [{"role": "user", "content": "the cat sat on"}]
PREFILLED = [*USER, {"role": "assistant", "content": "the mat and"}]
# the tiny model's template (ChatML) written out by hand: the conversation's prompt, with the
# opening of the assistant's turn, and with the last message left open
OPENED = "<|im_start|>user\nthe cat sat on<|im_end|>\n<|im_start|>assistant\n"
CONTINUED = OPENED + "the mat and"


def test_the_routers_chat_body_is_answered_as_the_plain_request(server):
    status, plain = _chat(server, USER)
    assert status == 200, plain
    status, routed = _chat(server, USER, **ROUTER_CHAT)
    assert status == 200, routed
    assert routed["choices"][0]["message"] == plain["choices"][0]["message"]


def test_continue_final_message_continues_the_last_message(server):
    status, body = _chat(server, PREFILLED, continue_final_message=True, add_generation_prompt=False)
    assert status == 200, body
    status, raw = _complete(server, prompt=CONTINUED)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": raw["choices"][0]["text"]}
    assert body["usage"]["prompt_tokens"] == raw["usage"]["prompt_tokens"]


def test_echo_puts_the_continued_message_before_the_answer_whole_and_streamed(server):
    fields = {"continue_final_message": True, "add_generation_prompt": False}
    status, plain = _chat(server, PREFILLED, **fields)
    status, echoed = _chat(server, PREFILLED, echo=True, **fields)
    assert status == 200, echoed
    assert echoed["choices"][0]["message"]["content"] == "the mat and" + plain["choices"][0]["message"]["content"]
    status, _, data = server.http("POST", "/v1/chat/completions", {"messages": PREFILLED, "max_tokens": 12,
                                                                   "echo": True, "stream": True, **fields})
    chunks = [json.loads(line[6:]) for line in data.decode().splitlines()
              if line.startswith("data: {")]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert streamed == echoed["choices"][0]["message"]["content"]
    status, opened = _chat(server, USER, echo=True)
    assert opened["choices"][0]["message"]["content"] == _chat(server, USER)[1]["choices"][0]["message"]["content"], \
        "the last message is the user's, not the answer's role: nothing to echo"


def test_add_generation_prompt_false_leaves_the_turn_unopened(server):
    status, body = _chat(server, USER, add_generation_prompt=False)
    assert status == 200, body
    status, raw = _complete(server, prompt=OPENED.removesuffix("<|im_start|>assistant\n"))
    assert body["choices"][0]["message"] == {"role": "user", "content": raw["choices"][0]["text"]}, \
        "vLLM's rule: the answer's role is the last message's"
    status, opened = _chat(server, USER)
    status, raw = _complete(server, prompt=OPENED)
    assert opened["choices"][0]["message"]["content"] == raw["choices"][0]["text"]


@pytest.mark.parametrize("fields, message", [
    ({"continue_final_message": True}, "continue_final_message needs add_generation_prompt false"),
    ({"echo": "yes"}, "echo must be true or false"),
    ({"ignore_eos": True, "response_format": {"type": "json_object"}}, "ignore_eos cannot go with response_format"),
    ({"continue_final_mesage": True}, "unknown field: continue_final_mesage"),
])
def test_a_chat_field_slm_cannot_honour_is_a_400_saying_why(server, fields, message):
    status, body = _chat(server, PREFILLED, **fields)
    assert status == 400
    assert message in body["error"]["message"]


def _ids(body: dict) -> list[int]:
    """The answer's token ids, as return_tokens_as_token_ids names them in its logprobs."""
    return [int(t.removeprefix("token_id:")) for t in body["choices"][0]["logprobs"]["tokens"]]


def _eos_first(tok) -> dict:
    """A logit_bias that makes end-of-generation the greedy choice at every step."""
    return {str(t): 100 for t in tok.eos_ids}


def test_return_tokens_as_token_ids_names_each_token_by_its_id(server, tok):
    status, plain = _complete(server, logprobs=2)
    status, body = _complete(server, logprobs=2, return_tokens_as_token_ids=True)
    assert status == 200, body
    ids = _ids(body)
    assert tok.decode(ids) == body["choices"][0]["text"] == plain["choices"][0]["text"]
    assert [tok.decode([i]) for i in ids] == plain["choices"][0]["logprobs"]["tokens"]
    assert all(k.startswith("token_id:") for top in body["choices"][0]["logprobs"]["top_logprobs"] for k in top)
    status, chat = _chat(server, USER, logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True)
    status, named = _chat(server, USER, logprobs=True, top_logprobs=2)
    for by_id, by_text in zip(chat["choices"][0]["logprobs"]["content"], named["choices"][0]["logprobs"]["content"]):
        assert tok.decode([int(by_id["token"].removeprefix("token_id:"))]) == by_text["token"]
        assert by_id["bytes"] == by_text["bytes"] and by_id["logprob"] == by_text["logprob"]
        assert [a["token"].startswith("token_id:") for a in by_id["top_logprobs"]] == [True, True]


def test_ignore_eos_generates_exactly_max_tokens(server, tok):
    status, ended = _complete(server, logit_bias=_eos_first(tok))
    assert (ended["usage"]["completion_tokens"], ended["choices"][0]["finish_reason"]) == (1, "stop")
    status, body = _complete(server, logit_bias=_eos_first(tok), ignore_eos=True)
    assert status == 200, body
    assert (body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]) == (12, "length")
    assert body["choices"][0]["text"] == "", "an end-of-generation token's text is special: skipped"


def test_skip_special_tokens_false_keeps_the_special_tokens_text(server, tok):
    status, body = _complete(server, logit_bias=_eos_first(tok), ignore_eos=True, skip_special_tokens=False,
                             max_tokens=3)
    assert status == 200, body
    eos = tok.decode([min(tok.eos_ids)], special=True)
    assert eos and body["choices"][0]["text"] == eos * 3


def test_min_tokens_holds_off_the_end_until_then(server, tok):
    status, body = _complete(server, logit_bias=_eos_first(tok), min_tokens=5, logprobs=0,
                             return_tokens_as_token_ids=True)
    assert status == 200, body
    assert (body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]) == (6, "stop")
    assert len(_ids(body)) == 5 and not set(_ids(body)) & tok.eos_ids


def test_stop_token_ids_end_the_answer_and_include_stop_str_keeps_its_text(server, tok):
    status, plain = _complete(server, logprobs=0, return_tokens_as_token_ids=True)
    ids = _ids(plain)
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i] and tok.decode([ids[i]]))
    status, body = _complete(server, stop_token_ids=[ids[k]])
    assert status == 200, body
    assert body["choices"][0]["text"] == tok.decode(ids[:k])
    assert (body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]) == (k + 1, "stop")
    status, body = _complete(server, stop_token_ids=[ids[k]], include_stop_str_in_output=True)
    assert body["choices"][0]["text"] == tok.decode(ids[:k + 1])


def test_include_stop_str_in_output_keeps_the_stop_sequence(server):
    status, plain = _complete(server)
    text = plain["choices"][0]["text"]
    stop = text[len(text) // 2:][:3]
    status, body = _complete(server, stop=[stop], include_stop_str_in_output=True)
    assert status == 200, body
    assert body["choices"][0]["text"] == text[:text.index(stop) + len(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"


def test_repetition_penalty_counts_the_prompts_tokens(server, tok):
    """A penalty so strong that a greedy answer takes no token it counts: vLLM's
    repetition_penalty counts the prompt's, repeat_penalty (llama.cpp's name) the answer's only."""
    status, plain = _complete(server, logprobs=0, return_tokens_as_token_ids=True)
    text = PROMPT + tok.decode(_ids(plain)[:4])  # (a prompt whose own tokens the model goes on with)
    prompt = set(tok.encode(text))
    ids = {"logprobs": 0, "return_tokens_as_token_ids": True}
    status, body = _complete(server, prompt=text, repetition_penalty=1e4, **ids)
    assert status == 200, body
    assert not set(_ids(body)) & prompt
    status, other = _complete(server, prompt=text, repeat_penalty=1e4, **ids)
    assert set(_ids(other)) & prompt, "the answer-only penalty lets a prompt token through (else the test shows nothing)"
    assert len(set(_ids(other))) == len(_ids(other))


@pytest.mark.parametrize("fields, message", [
    ({"stop_token_ids": [10 ** 9]}, "stop_token_ids: 1000000000 is not a token id"),
    ({"min_tokens": 13}, "min_tokens (13) must be at most max_tokens (12)"),
    ({"repetition_penalty": 1.1, "repeat_penalty": 1.1}, "not both"),
    ({"echo": True}, "unsupported field: echo"),
    ({"add_generation_prompt": False}, "unsupported field: add_generation_prompt (on chat completions only)"),
    ({"include_stop_str_in_outptu": True}, "unknown field: include_stop_str_in_outptu"),
])
def test_a_vllm_field_slm_cannot_honour_is_a_400_saying_why(server, fields, message):
    status, body = _complete(server, **fields)
    assert status == 400
    assert message in body["error"]["message"]


def test_the_api_and_the_server_give_one_answer_to_vllms_options(server, template, tok, tmp_path):
    """One request type, two doors: Session.generate and Session.chat take the same options."""
    session = slm.Runtime(slm.Store.open(copy_store(template, tmp_path)), threads=1).session()
    bias = {int(k): v for k, v in _eos_first(tok).items()}
    generation = session.generate(PROMPT, 12, logit_bias=bias, min_tokens=5, include_stop_str_in_output=True,
                                  skip_special_tokens=False)
    status, body = _complete(server, logit_bias=_eos_first(tok), min_tokens=5, include_stop_str_in_output=True,
                             skip_special_tokens=False)
    assert generation.text == body["choices"][0]["text"] and len(generation.tokens) == 6
    assert generation.text.endswith(tok.decode([generation.tokens[-1]], special=True)), "the kept end's text"
    answer = session.chat(PREFILLED, 12, continue_final_message=True, add_generation_prompt=False)
    status, body = _chat(server, PREFILLED, continue_final_message=True, add_generation_prompt=False)
    assert answer.text == body["choices"][0]["message"]["content"]


@pytest.mark.hostile
def test_min_tokens_with_a_bias_that_bans_every_other_token_is_a_400(server, tok, template):
    """The bias bans all but the end tokens, min_tokens bans those: sampling would draw from
    nothing (a NaN distribution at temperature > 0, a 500)."""
    vocab = slm.Store.open(template).tokenizer("tq").vocab_size
    bias = {str(t): -100 for t in range(vocab) if t not in tok.eos_ids}
    status, body = _complete(server, logit_bias=bias, min_tokens=2, temperature=1.0)
    assert status == 400, body
    assert "nothing is left to generate" in body["error"]["message"]


def test_without_max_tokens_min_tokens_raises_the_default(server, tok):
    body = {"prompt": PROMPT, "min_tokens": 130, "ignore_eos": True}
    status, answer = server.json("POST", "/v1/completions", body)
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == 130, "the default (128) would have been below min_tokens"


def test_streamed_answers_equal_the_whole_ones_with_the_stop_options(server, tok):
    status, plain = _complete(server, logprobs=0, return_tokens_as_token_ids=True)
    text, ids = plain["choices"][0]["text"], _ids(plain)
    for fields in ({"stop": [text[len(text) // 2:][:3]], "include_stop_str_in_output": True},
                   {"stop_token_ids": [ids[3]], "include_stop_str_in_output": True},
                   {"stop_token_ids": [ids[3]], "min_tokens": 4}):
        status, whole = _complete(server, **fields)
        status, _, data = server.http("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "stream": True,
                                                                  **fields})
        chunks = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: {")]
        assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"], fields
        assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"], fields
