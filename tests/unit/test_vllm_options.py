"""vLLM's generation options in the engine (issue 46), each with vLLM's meaning: stop token ids,
include_stop_str_in_output, min_tokens, ignore_eos (slm.engine.stops), min_tokens' ban and
repetition_penalty (slm.engine.processors), continue_final_message (slm.model.chat), and their
checks in the one request type (slm.engine.request.GenerationRequest)."""

from __future__ import annotations

import numpy as np
import pytest

from slm.engine.processors import MinTokens, RepeatPenalty, processors_for
from slm.engine.request import GenerationRequest
from slm.engine.stops import EOS, LENGTH, STOP, StopRules
from slm.errors import InvalidInput
from slm.model.chat import continue_final

VOCAB = "abcdefghijklmnopqrstuvwxyzEND ."
EOS_ID = 99
DOT = VOCAB.index(".")


def _decode(ids: list[int]) -> str:
    return "".join("<eos>" if i == EOS_ID else VOCAB[i] for i in ids)


def _ids(text: str) -> list[int]:
    return [VOCAB.index(c) for c in text]


def _feed(rules: StopRules, ids: list[int]) -> str | None:
    for token in ids:
        if reason := rules.take(token, cache_full=False):
            return reason
    return None


def _rules(stops=(), **options):
    sent: list[str] = []
    return StopRules({EOS_ID}, 100, _decode, stops, on_text=sent.append, **options), sent


def test_a_stop_token_ends_the_answer_without_its_text():
    rules, sent = _rules(stop_ids={DOT})
    assert _feed(rules, _ids("ab.cd")) == STOP
    assert rules.text == "ab" == "".join(sent) and rules.ids == _ids("ab.")
    assert rules.hidden(DOT) and not rules.hidden(VOCAB.index("a"))


def test_include_stop_keeps_the_stop_sequence_and_the_stop_tokens_text():
    rules, sent = _rules(["END"], include_stop=True)
    assert _feed(rules, _ids("abENDx")) == STOP
    assert rules.text == "abEND" == "".join(sent)
    rules, _ = _rules(stop_ids={DOT}, include_stop=True)
    assert _feed(rules, _ids("ab.")) == STOP and rules.text == "ab." and not rules.hidden(DOT)
    rules, _ = _rules(include_stop=True)
    assert _feed(rules, [*_ids("ab"), EOS_ID]) == EOS and rules.text == "ab<eos>"


def test_include_stop_holds_nothing_back():
    rules, sent = _rules(["END"], include_stop=True)
    assert _feed(rules, _ids("abEN")) is None and "".join(sent) == "abEN"


def test_no_stop_applies_until_more_than_min_tokens_tokens():
    """vLLM's count: a stop sequence ending within the first min_tokens tokens never counts,
    the first that ends later does; an end-of-generation or stop token counts from token
    min_tokens + 1 on (the processor bans them before)."""
    rules, _ = _rules(["a"], min_tokens=3)
    assert _feed(rules, _ids("bab")) is None, "an 'a' within the first 3 tokens"
    assert _feed(rules, _ids("a")) == STOP and rules.text == "bab"
    rules, _ = _rules(stop_ids={DOT}, min_tokens=2)
    assert _feed(rules, _ids(".")) is None and _feed(rules, _ids(".")) is None
    assert _feed(rules, _ids(".")) == STOP
    rules, _ = _rules(min_tokens=1)
    assert _feed(rules, [EOS_ID]) is None and _feed(rules, [EOS_ID]) == EOS


def test_without_end_of_generation_ids_the_token_is_an_answer_token():
    rules = StopRules((), 3, _decode)  # (what ignore_eos gives the stop rules)
    assert _feed(rules, [EOS_ID, EOS_ID, EOS_ID]) == LENGTH and len(rules.ids) == 3
    assert not rules.hidden(EOS_ID)


def test_min_tokens_bans_the_ending_tokens_until_then():
    ban = MinTokens(2, [EOS_ID, DOT])
    logits = np.zeros(100, dtype=np.float32)
    assert np.isneginf(ban([], logits)[[EOS_ID, DOT]]).all()
    assert np.isneginf(ban([1], logits)[[EOS_ID, DOT]]).all()
    assert (ban([1, 2], logits) == 0).all()
    assert processors_for(min_tokens=2) == (), "nothing to ban: no processor"


def test_repetition_penalty_counts_the_prompt_repeat_penalty_does_not():
    logits = np.array([2.0, -2.0, 2.0, 1.0], dtype=np.float32)
    vllm = RepeatPenalty(2.0, prompt_ids=[0, 1])([3], logits)
    assert vllm.tolist() == [1.0, -4.0, 2.0, 0.5]
    llama = RepeatPenalty(2.0)([3], logits)
    assert llama.tolist() == [2.0, -2.0, 2.0, 0.5]
    (one,) = processors_for(repetition_penalty=2.0, prompt_ids=[0, 1])
    assert one([3], logits).tolist() == vllm.tolist()


@pytest.mark.parametrize("text, content, expected", [
    ("<u>hi</u><a>The answer is</a>", "The answer is", "<u>hi</u><a>The answer is"),
    ("<a>The answer is</a>", "The answer is  ", "<a>The answer is"),  # a template that trims
    ("<a>ok</a><a>ok</a>", "ok", "<a>ok</a><a>ok"),  # the last occurrence
])
def test_continue_final_cuts_after_the_last_message(text, content, expected):
    assert continue_final(text, {"role": "assistant", "content": content}) == expected


def test_continue_final_refuses_a_message_the_template_dropped():
    with pytest.raises(InvalidInput, match="does not contain the last message"):
        continue_final("<u>hi</u>", {"role": "assistant", "content": "gone"})


CHAT = ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure:"})


@pytest.mark.parametrize("options, message", [
    ({"continue_final_message": True}, "needs add_generation_prompt false"),
    ({"add_generation_prompt": False, "prompt": "x", "messages": None}, "are for a chat"),
    ({"min_tokens": 4, "max_tokens": 3}, r"min_tokens \(4\) must be at most max_tokens \(3\)"),
    ({"min_tokens": -1}, "min_tokens must be an integer >= 0"),
    ({"stop_token_ids": [1, -2]}, "stop_token_ids must be a list of token ids"),
    ({"stop_token_ids": list(range(257))}, "at most 256"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a finite number > 0"),
    ({"repetition_penalty": 1.2, "repeat_penalty": 1.1}, "not both"),
    ({"ignore_eos": 1}, "ignore_eos must be true or false"),
    ({"ignore_eos": True, "response_format": {"type": "json_object"}}, "ignore_eos cannot go with response_format"),
    ({"min_tokens": 2, "response_format": {"type": "json_object"}}, "min_tokens cannot go with response_format"),
])
def test_the_request_type_refuses_what_vllm_refuses_or_slm_cannot_do(options, message):
    with pytest.raises(InvalidInput, match=message):
        GenerationRequest(**{"messages": CHAT, **options})


def test_the_request_type_keeps_the_options_normalised():
    req = GenerationRequest(messages=CHAT, stop_token_ids=[5, 2, 5], add_generation_prompt=False,
                            continue_final_message=True, min_tokens=3, ignore_eos=True)
    assert req.stop_token_ids == (2, 5) and req.min_tokens == 3 and req.ignore_eos
