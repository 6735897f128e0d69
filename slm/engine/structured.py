"""Structured output: a ResponseFormat (slm.engine.request) turned into a grammar checked against a
composition's vocabulary, and the per-sequence logit processor that enforces it
(slm.engine.grammar). `slm run --json-schema`, Session.generate(response_format=...) and the
server's response_format all go through these two functions."""

from __future__ import annotations

import uuid

from slm.errors import InvalidInput
from slm.engine.grammar import GrammarMask, compile_grammar, json_schema_grammar
from slm.engine.json_object import json_object_grammar
from slm.engine.tools import tool_format
from slm.engine.request import ResponseFormat, ToolCall, Tools
from slm.engine.target import Target


def grammar_for(target: Target, fmt: ResponseFormat | None, tools: Tools | None = None) -> str | None:
    """The compiled grammar of a response format, or of forced tool calls (tool_choice required
    or a named function), on this composition's vocabulary (None: free text); InvalidInput
    with the engine's reason for a schema it cannot compile."""
    forced = tools is not None and tools.forced
    if fmt is not None and forced:
        raise InvalidInput("response_format and a forced tool_choice both constrain the answer; give one")
    if forced:
        grammar = tool_format(target.tokenizer.chat_template).grammar(tools.definitions, tools.name, tools.parallel)
    elif fmt is not None and fmt.kind == "json_object":  # any object, each structure bounded
        grammar = json_object_grammar()
    elif fmt is not None:
        grammar = json_schema_grammar(fmt.schema)
    else:
        return None
    return compile_grammar(target.tokenizer, grammar, target.model.cfg.vocab_size)


def tool_answer(target: Target, text: str) -> tuple[str | None, tuple[ToolCall, ...]]:
    """An answer's text outside its tool calls, and the calls (each with a fresh id), read in
    the format of the composition's chat template."""
    content, calls = tool_format(target.tokenizer.chat_template).parse(text)
    return content, tuple(ToolCall(f"call_{uuid.uuid4().hex[:24]}", c.name, c.arguments) for c in calls)


def grammar_masks(target: Target, grammar: str | None, max_tokens: int) -> tuple:
    """The logit processors of one sequence following `grammar` (its own matcher), closing a
    JSON answer within `max_tokens` (slm.engine.grammar)."""
    if grammar is None:
        return ()
    return (GrammarMask(target.tokenizer, grammar, target.model.cfg.vocab_size, budget=max_tokens),)
