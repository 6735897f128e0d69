"""Structured output: a ResponseFormat (slm.ops.request) turned into a grammar checked against a
composition's vocabulary, and the per-sequence logit processor that enforces it
(slm.model.grammar). `slm run --json-schema`, Session.generate(response_format=...) and the
server's response_format all go through these two functions."""

from __future__ import annotations

from slm.model.grammar import GrammarMask, compile_grammar, json_schema_grammar
from slm.ops.loading import Loaded
from slm.ops.request import ResponseFormat


def grammar_for(loaded: Loaded, fmt: ResponseFormat | None) -> str | None:
    """The compiled grammar of a response format on this composition's vocabulary (None: free
    text); InvalidInput with the engine's reason for a schema it cannot compile."""
    if fmt is None:
        return None
    return compile_grammar(loaded.tokenizer, json_schema_grammar(fmt.schema), loaded.model.cfg.vocab_size)


def processors_for(loaded: Loaded, grammar: str | None) -> tuple:
    """The logit processors of one sequence following `grammar` (its own matcher)."""
    if grammar is None:
        return ()
    return (GrammarMask(loaded.tokenizer, grammar, loaded.model.cfg.vocab_size),)
