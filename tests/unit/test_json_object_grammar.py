"""The bounded grammar of `response_format: json_object` (slm.engine.json_object), driven byte by
byte through llguidance's own matcher: it takes ordinary objects (nested, arrays, unicode and
escaped strings, numbers) up to each bound, refuses one step beyond each, and a writer that
loops inside a structure is made to close it, so its answer still parses."""

from __future__ import annotations

import itertools
import json

import pytest

pytest.importorskip("llguidance")
from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper  # noqa: E402

from slm.engine import json_object as bounds  # noqa: E402
from slm.engine.json_object import json_object_grammar  # noqa: E402

EOS = 256


class _ByteVocabulary:
    """One token per byte, and an end-of-generation token: the matcher sees every byte alone."""

    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    eos_token_id = EOS
    bos_token_id = None
    special_token_ids = [EOS]

    def __call__(self, text):
        return list(text.encode() if isinstance(text, str) else text)


@pytest.fixture(scope="module")
def byte_tokenizer():
    return LLTokenizer(TokenizerWrapper(_ByteVocabulary()), n_vocab=EOS + 1, eos_token=[EOS])


def _matcher(byte_tokenizer) -> LLMatcher:
    matcher = LLMatcher(byte_tokenizer, json_object_grammar(), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def _takes(byte_tokenizer, text: str) -> bool:
    """Whether the grammar takes `text` whole, as a complete answer."""
    matcher = _matcher(byte_tokenizer)
    data = list(text.encode())
    return matcher.try_consume_tokens(data) == len(data) and matcher.is_accepting()


def _nested(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def _inside(depth: int, container: str) -> str:
    """`container` as the one value of objects nested so that it is at `depth` (the answer: 1)."""
    return '{"a":' * (depth - 1) + container + "}" * (depth - 1)


def _members(depth: int, count: int) -> str:
    return _inside(depth, "{" + ",".join(f'"k{i}":{i}' for i in range(count)) + "}")


def _items(depth: int, count: int) -> str:
    return _inside(depth, "[" + ",".join(["1"] * count) + "]")


EVERY_BOUND_AT_DEPTH = [(depth, members, items) for depth, (members, items)
                        in enumerate(zip(bounds.MEMBERS_AT_DEPTH, bounds.ITEMS_AT_DEPTH), start=1)]


def _string(chars: int) -> str:
    return '{"a":"' + "x" * chars + '"}'


def _key(chars: int) -> str:
    return '{"' + "k" * chars + '":1}'


def _number(integer: int, fraction: int, exponent: int) -> str:
    fraction_part = "." + "5" * fraction if fraction else ""
    exponent_part = "e+" + "7" * exponent if exponent else ""
    return '{"a":-' + "9" * integer + fraction_part + exponent_part + "}"


ORDINARY = [
    "{}",
    '{"name":"Rex","age":3,"weight":12.5,"vaccinated":true,"chip":null,"tags":["good","loud"],'
    '"owner":{"name":"Zoë","city":"東京","phones":[{"kind":"home","n":"+44 20"}]}}',
    '{"text":"a \\"quote\\", a \\\\ backslash, a tab\\t and \\u00e9","empty":"","list":[]}',
    '{"n":[0,-0.5,1e10,2.5E-3,-7],"nested":[[1,2],[3,[4]]],"emoji":"🐈"}',
    _nested(bounds.MAX_DEPTH), *(_members(depth, members) for depth, members, _ in EVERY_BOUND_AT_DEPTH),
    *(_items(depth, items) for depth, _, items in EVERY_BOUND_AT_DEPTH if depth > 1),
    _string(bounds.MAX_STRING_CHARS), _key(bounds.MAX_KEY_CHARS),
    _number(bounds.MAX_INT_DIGITS, bounds.MAX_FRACTION_DIGITS, bounds.MAX_EXPONENT_DIGITS),
    '{"a":"' + "é" * bounds.MAX_STRING_CHARS + '"}',  # the bound counts characters, not bytes
]


@pytest.mark.parametrize("text", ORDINARY)
def test_the_bounded_json_object_grammar_takes_ordinary_objects_up_to_each_bound(byte_tokenizer, text):
    assert isinstance(json.loads(text), dict)
    assert _takes(byte_tokenizer, text)


BEYOND = {
    "nesting": _nested(bounds.MAX_DEPTH + 1),
    **{f"members at depth {depth}": _members(depth, members + 1) for depth, members, _ in EVERY_BOUND_AT_DEPTH},
    **{f"items at depth {depth}": _items(depth, items + 1) for depth, _, items in EVERY_BOUND_AT_DEPTH if depth > 1},
    "string": _string(bounds.MAX_STRING_CHARS + 1),
    "key": _key(bounds.MAX_KEY_CHARS + 1),
    "integer digits": _number(bounds.MAX_INT_DIGITS + 1, 0, 0),
    "fraction digits": _number(1, bounds.MAX_FRACTION_DIGITS + 1, 0),
    "exponent digits": _number(1, 1, bounds.MAX_EXPONENT_DIGITS + 1),
    "an array answer": "[1]",
    "a string answer": '"x"',
    "whitespace": '{"a": 1}',
    "a leading zero": '{"a":01}',
    "a raw newline in a string": '{"a":"x\ny"}',
    "two objects": "{}{}",
}


@pytest.mark.parametrize("what", BEYOND)
def test_the_bounded_json_object_grammar_refuses_one_step_beyond_each_bound(byte_tokenizer, what):
    assert not _takes(byte_tokenizer, BEYOND[what])


def _allowed(matcher: LLMatcher) -> set[int]:
    mask = matcher.compute_bitmask()
    return {i for i in range(EOS + 1) if mask[i // 8] >> (i % 8) & 1}


def _loop(byte_tokenizer, opening: str, again: str, limit: int = 20000) -> str:
    """What a writer gets that writes `opening` and then `again` forever, taking at each step
    its next byte if the grammar allows it and else the first allowed of a quote, a closing
    brace or bracket, a colon, the end, or else the lowest allowed byte (a model's next-likeliest
    tokens): the answer it ends with."""
    matcher = _matcher(byte_tokenizer)
    wanted = itertools.chain(opening.encode(), itertools.cycle(again.encode()))
    out = bytearray()
    for _ in range(limit):
        allowed = _allowed(matcher)
        byte = next(wanted)
        if byte not in allowed:
            byte = next((b for b in (*b'"}]:', EOS) if b in allowed), min(allowed))
        if byte == EOS:
            assert matcher.is_accepting()
            return out.decode()
        assert matcher.consume_token(byte)
        out.append(byte)
    raise AssertionError(f"no end within {limit} bytes: {out[-200:]!r}")


LOOPS = {  # the loops SmolLM2 and Gemma 3 fell into, sampled, under {"type": "object"}
    "a phrase in a string": ('{"description":"A pet', " with a pet-id as a pet,"),
    "a number's digits": ('{"weight":1000.21', "2524616416814286"),
    "a key without end": ('{"', "Lemon Ash-"),
    "the same member": ('{"image_path":"a.jpg"', ',"image_path":"a.jpg"'),
    "an object in an object": ("", '{"species":'),
    "an array in an array": ('{"a":', "[1,"),
}


@pytest.mark.parametrize("loop", LOOPS)
def test_a_writer_that_loops_is_made_to_close_and_its_answer_parses(byte_tokenizer, loop):
    answer = _loop(byte_tokenizer, *LOOPS[loop])
    assert isinstance(json.loads(answer), dict), answer
