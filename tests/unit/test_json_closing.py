"""An answer bound by a JSON grammar is closed within its max_tokens (slm.engine.grammar's budget,
slm.engine.json_closing's shortest closing): it parses even when the budget ends it, and it says
it was cut (finish reason "length"), never that it ended by itself."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slm
from helpers import tiny_store
from slm.engine.json_closing import closing

pytest.importorskip("llguidance")

documents = st.dictionaries(
    st.text(max_size=6),
    st.recursive(
        st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=6),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_leaves=10),
    max_size=4)


@settings(max_examples=200, deadline=None)
@given(documents, st.booleans())
def test_every_prefix_of_a_compact_json_object_closes_into_json(doc, ascii_only):
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=ascii_only)
    for end in range(len(text) + 1):
        prefix = text[:end]
        rest = closing(prefix)
        assert rest is not None, prefix
        assert isinstance(json.loads(prefix + rest), dict), (prefix, rest)
    assert closing(text) == ""


@pytest.mark.parametrize("prefix, rest", [
    ('{"name":"Fluffy","tags":["a","b', '"]}'),
    ('{"a":1,', '"":null}'),
    ('{"a":"x\\', 'n"}'),
    ('{"a":"\\u00', '00"}'),
    ('{"a":tr', "ue}"),
    ('{"a":-', "0}"),
])
def test_the_closing_is_the_shortest_structure_that_ends_the_value(prefix, rest):
    assert closing(prefix) == rest


@pytest.mark.parametrize("text", ['{"a" :1', '{"a":1]', "{,", "}", '{"a":1}}', '{"a":"\\uZZ'])
def test_text_that_is_not_a_compact_json_prefix_has_no_closing(text):
    assert closing(text) is None


def test_a_json_object_answer_cut_by_max_tokens_still_parses_and_says_length(tmp_path, tiny_model):
    """The tiny model's random weights write long JSON: with small budgets most answers would be
    cut mid-structure; every one parses, and those closed to fit say "length"."""
    store = slm.Store.open(tiny_store(tmp_path, tiny_model))
    reasons = []
    session = slm.Runtime(store).session("tq")
    for seed in range(8):
        for max_tokens in (6, 12, 24):
            g = session.generate("pet", max_tokens=max_tokens, temperature=1.0, seed=seed,
                                 response_format={"type": "json_object"})
            assert isinstance(json.loads(g.text), dict), (seed, max_tokens, g.text)
            assert len(g.tokens) <= max_tokens
            reasons.append(g.stop_reason)
    assert set(reasons) <= {"eos", "length"}
    assert "length" in reasons  # (the budgets are far below what these answers run to)
