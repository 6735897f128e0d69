"""Grammars that accept no finite document: the productivity analysis of a JSON schema
(slm.engine.schema_productive), `slm run --json-schema` refusing such a schema (exit 4), and the
stop rules never reporting an answer its grammar rejects as one that ended by itself."""

from __future__ import annotations

import json

import numpy as np
import pytest

import slm
from helpers import one_line, snapshot, tiny_store
from slm.engine.schema_productive import accepts_a_document

pytest.importorskip("llguidance")

SELF = {"$ref": "#"}
CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
REQUIRED_SELF = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}


@pytest.mark.parametrize("schema", [
    SELF, CYCLE, REQUIRED_SELF, False, {"enum": []},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},  # a list must hold a list must hold ...
    {"definitions": {"n": {"type": "object", "properties": {"x": {"$ref": "#/definitions/n"}}, "required": ["x"]}},
     "$ref": "#/definitions/n"},  # draft-07's definitions
    {"type": "object", "required": ["x"], "additionalProperties": False},  # a required key it may not have
    {"anyOf": [SELF, {"$ref": "#/anyOf/0"}]},  # every alternative loops
    {"allOf": [{"type": "string"}, False]},
])
def test_a_schema_with_no_finite_document_is_unproductive(schema):
    assert not accepts_a_document(schema)


@pytest.mark.parametrize("schema", [
    {}, True, {"type": "object"},
    {"type": "object", "properties": {"next": {"$ref": "#"}}},  # recursion, but optional: {} ends it
    {"type": ["object", "null"], "properties": {"next": {"$ref": "#"}}, "required": ["next"]},  # null ends it
    {"anyOf": [{"$ref": "#"}, {"type": "integer"}]},
    {"type": "array", "items": {"$ref": "#"}},  # [] ends it
    {"$defs": {"tree": {"type": "object", "required": ["kids"],
                        "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}}},
     "$ref": "#/$defs/tree"},  # {"kids":[]} ends it
    {"$ref": "#/$defs/missing"},  # not followed: the engine's to refuse
    {"properties": {"next": {"$ref": "#"}}, "required": ["next"]},  # no type: null is an instance
])
def test_a_schema_with_a_finite_document_is_productive(schema):
    assert accepts_a_document(schema)


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("productive"), tiny_model)


@pytest.mark.hostile
@pytest.mark.parametrize("schema", [SELF, CYCLE, REQUIRED_SELF], ids=["self", "cycle", "required-self"])
def test_run_refuses_a_json_schema_with_no_finite_document(cli, template, tmp_path, schema):
    from helpers import copy_store

    store = copy_store(template, tmp_path)
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    before = snapshot(store)
    r = cli("--store", store, "run", "hello", "--json-schema", path, "--max-tokens", "8")
    assert r.code == 4, (r.code, r.out, r.err)
    assert one_line(r.err) and "accepts no finite JSON document" in r.err
    assert snapshot(store) == before


@pytest.mark.hostile
def test_an_end_where_the_grammar_is_not_complete_is_a_cut_not_a_stop(template, tmp_path):
    """A grammar that can go no further without being complete (here `{` and then a rule that
    derives nothing, which no schema analysis sees): llguidance lets only the end through; the
    answer is reported cut ("length"), never "eos"."""
    from llguidance import LLMatcher

    from slm.engine.generate import generate
    from slm.engine.grammar import GrammarMask, compile_grammar
    from slm.engine.sampling import Sampler
    from slm.engine.stops import LENGTH

    store = slm.Store.open(template)
    tok = store.tokenizer("tq")
    vocab = tok.vocab_size
    grammar = compile_grammar(tok, LLMatcher.grammar_from_lark('start: "{" loop\nloop: loop'), vocab)
    model = slm.Runtime(store).stage("tq").model
    for seed in range(3):
        mask = GrammarMask(tok, grammar, vocab, budget=16)
        gen = generate(model, tok.encode("hello"), 16, Sampler(1.0, seed=seed), frozenset(tok.eos_ids),
                       processors=(mask,))
        assert gen.ids[-1] in tok.eos_ids and len(gen.ids) < 16, gen.ids  # it ended, before max_tokens
        assert tok.decode(gen.ids[:-1]) == "{" and not mask.complete
        assert gen.stop_reason == LENGTH, (seed, gen.stop_reason)


@pytest.mark.hostile
@pytest.mark.parametrize("kind", ["hermes", "gemma"])
def test_tool_parameters_resolve_their_refs_within_themselves(template, kind):
    """Two tools, one with `$defs`, one with draft-07 `definitions`, both forced: each call's
    arguments are held to its own function's schema, refs followed inside the parameters."""
    from llguidance import LLMatcher

    from slm.engine import tools, tools_gemma
    from slm.engine.grammar import compile_grammar, grammar_tokenizer

    place = {"type": "object", "properties": {"city": {"enum": ["oslo", "lima"]}}, "required": ["city"],
             "additionalProperties": False}
    zone = {"type": "object", "properties": {"zone": {"type": "integer"}}, "required": ["zone"],
            "additionalProperties": False}
    defs = {"$defs": {"Place": place}, "type": "object", "properties": {"to": {"$ref": "#/$defs/Place"}},
            "required": ["to"], "additionalProperties": False}
    drafted = {"definitions": {"Zone": zone}, "type": "object", "properties": {"at": {"$ref": "#/definitions/Zone"}},
               "required": ["at"], "additionalProperties": False}
    offered = [{"type": "function", "function": {"name": "go", "parameters": defs}},
               {"type": "function", "function": {"name": "tz", "parameters": drafted}}]
    fmt, key = (tools, "arguments") if kind == "hermes" else (tools_gemma, "parameters")
    tok = slm.Store.open(template).tokenizer("tq")
    lltok = grammar_tokenizer(tok, tok.vocab_size)
    grammar = compile_grammar(tok, fmt.call_grammar(offered, None, False), tok.vocab_size)

    def accepted(name: str, args: dict) -> bool:
        body = json.dumps({"name": name, key: args}, separators=(",", ":"))
        text = f"{tools.CALL_OPEN}\n{body}\n{tools.CALL_CLOSE}" if kind == "hermes" else body
        ids = lltok.tokenize_str(text)
        return LLMatcher(lltok, grammar, log_level=0).validate_tokens(ids) == len(ids)

    assert accepted("go", {"to": {"city": "oslo"}}) and accepted("tz", {"at": {"zone": 3}})
    assert not accepted("go", {"to": {"city": "rome"}}) and not accepted("tz", {"at": {"zone": "3"}})
    assert not accepted("go", {"at": {"zone": 3}})


@pytest.mark.hostile
def test_a_stop_sequence_that_cuts_a_constrained_answer_is_a_cut_not_a_stop(template):
    """A stop sequence inside a JSON answer leaves text its grammar rejects: reported "length".
    One that leaves a complete document (a grammar that may go on after one) stays "stop"."""
    from llguidance import LLMatcher

    from slm.engine.generate import generate
    from slm.engine.grammar import GrammarMask, compile_grammar, json_schema_grammar
    from slm.engine.sampling import Sampler
    from slm.engine.stops import LENGTH, STOP

    store = slm.Store.open(template)
    tok = store.tokenizer("tq")
    vocab = tok.vocab_size
    model = slm.Runtime(store).stage("tq").model
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
              "additionalProperties": False}
    cases = [(json_schema_grammar(schema), '"', LENGTH, "{"),  # `{"a":...` cut at its first quote
             (LLMatcher.grammar_from_lark('start: "x" ("-" "x")*'), "-", STOP, "x")]  # `x` is whole
    eos = sorted(tok.eos_ids)

    def no_end(ids, logits):  # (the model goes on past a complete `x`, as the test needs)
        out = logits.copy()
        out[eos] = -np.inf
        return out

    for grammar, stop, reason, text in cases:
        mask = GrammarMask(tok, compile_grammar(tok, grammar, vocab), vocab, budget=16)
        gen = generate(model, tok.encode("hello"), 16, Sampler(0.0), frozenset(tok.eos_ids),
                       decode_text=tok.decode, stop_sequences=(stop,), processors=(no_end, mask))
        assert (gen.stop_cut, gen.stop_reason) == (text, reason)
