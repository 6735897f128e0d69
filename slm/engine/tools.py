"""Tool calls in a base's own chat format: whether its template takes `tools`, the grammar of
a forced call, and the calls read back out of an answer (tool_format: one ToolFormat per kind).

Hermes-style, here: the format Qwen 2.5/3 templates teach the model, each call a JSON object
{"name": ..., "arguments": {...}} between <tool_call> and </tool_call> lines. Gemma 3's
prompted calls: slm.engine.tools_gemma. Any other template (one that never reads `tools`, or
writes calls some other way) is refused (InvalidInput) rather than guessed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from slm.errors import InvalidInput
from slm.engine.schema_productive import accepts_a_document

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.DOTALL)
# compact JSON inside a forced call (as for response_format: no room for endless whitespace)
_COMPACT = {"whitespace_flexible": False}


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True)
class ToolFormat:
    """How one base's model is shown tools and writes calls: the conversation (and tools) handed
    to its chat template, the grammar of a forced answer, the calls read back, the stream gate."""

    name: str  # "hermes" (<tool_call> blocks: Qwen 2.5/3) or "gemma" (Gemma 3's prompted JSON calls)
    prompt: Callable[[list[dict], list[dict]], tuple[list[dict], list[dict] | None]]
    grammar: Callable[[list[dict], str | None, bool], str]
    parse: Callable[[str], tuple[str | None, list[ParsedCall]]]
    gate: Callable[[Callable[[str], None]], object]  # emit -> an object with push(piece) and rest(content)


def tool_format(template: str | None) -> ToolFormat:
    """The tool format of a chat template: Hermes-style for one that renders `tools` and writes
    calls as <tool_call>; Gemma 3's prompted calls for a Gemma-turn template (which never reads
    `tools`: slm.engine.tools_gemma); InvalidInput for any other."""
    from slm.engine import tools_gemma

    if template and "tools" in _variables(template):
        if CALL_OPEN not in template:
            raise InvalidInput("this base's chat template writes tool calls in a format slm does not read "
                               f"(slm reads {CALL_OPEN}{{\"name\": ..., \"arguments\": ...}}{CALL_CLOSE})")
        return HERMES
    if template and tools_gemma.uses_gemma_turns(template):
        return ToolFormat("gemma", lambda messages, tools: (tools_gemma.prompt_messages(messages, tools), None),
                          tools_gemma.call_grammar, tools_gemma.parse_calls, tools_gemma.CallGate)
    raise InvalidInput("this base's chat template has no tool support (it never reads `tools`): "
                       "a request with tools cannot be rendered for it")


@lru_cache(maxsize=8)
def _variables(template: str) -> frozenset[str]:
    from jinja2 import Environment, TemplateSyntaxError, meta

    try:
        return frozenset(meta.find_undeclared_variables(Environment().parse(template)))
    except TemplateSyntaxError:
        return frozenset()


def call_grammar(tools: list[dict], name: str | None, parallel: bool) -> str:
    """The llguidance grammar of an answer that is only tool calls (tool_choice "required" or a
    named function): one call, or with `parallel` one or more, each naming a given function
    with arguments valid under its parameters schema."""
    from llguidance import LLMatcher

    schema = call_schema(tools, name, "arguments")
    more = ' ("\\n" call)*' if parallel else ""  # further calls, one a line
    lark = "\n".join([f"start: call{more}",
                      f"call: {json.dumps(CALL_OPEN + chr(10))} body {json.dumps(chr(10) + CALL_CLOSE)}",
                      f"body: %json {json.dumps(schema)}"])
    return LLMatcher.grammar_from_lark(lark)


def call_schema(tools: list[dict], name: str | None, arguments: str) -> dict:
    """The JSON schema of one call's object: {"name": a chosen function's, `arguments`: valid
    under its parameters}. Each function's parameters are their own schema resource (an `$id`
    of their own unless they carry one), so their `$ref`s ("#/$defs/...", "#/definitions/...",
    "#") resolve against the parameters, as they do when the same schema is a response_format.
    InvalidInput for a name not among the tools, or parameters that accept no finite document
    (slm.engine.schema_productive)."""
    chosen = [(i, t["function"]) for i, t in enumerate(tools) if name is None or t["function"]["name"] == name]
    if not chosen:
        raise InvalidInput(f"tool_choice names {name!r}, which is not among the tools")
    options = []
    for index, f in chosen:
        params = f.get("parameters") or {"type": "object"}
        if not accepts_a_document(params):
            raise InvalidInput(f"tool {f['name']!r}: its parameters schema accepts no finite JSON document "
                               "(a $ref cycle or a required property that contains itself)")
        if isinstance(params, dict) and "$id" not in params:
            params = {"$id": f"urn:slm:tool-parameters:{index}", **params}
        options.append({"type": "object", "additionalProperties": False, "required": ["name", arguments],
                        "properties": {"name": {"const": f["name"]}, arguments: params}})
    return {**(options[0] if len(options) == 1 else {"anyOf": options}), "x-guidance": _COMPACT}


def parse_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """The answer's text outside its calls (None if nothing is left; trailing whitespace
    dropped) and its calls, in order. A <tool_call> block that is not a JSON object with a
    string name stays in the text. What CallGate streamed is always a prefix of this text."""
    calls: list[ParsedCall] = []
    kept: list[str] = []
    last = 0
    for m in _CALL.finditer(text):
        try:
            doc = json.loads(m.group(1))
        except (json.JSONDecodeError, RecursionError):
            continue
        if not (isinstance(doc, dict) and isinstance(doc.get("name"), str)):
            continue
        args = doc.get("arguments", doc.get("parameters", {}))
        calls.append(ParsedCall(doc["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
        kept.append(text[last:m.start()])
        last = m.end()
    kept.append(text[last:])
    content = "".join(kept).rstrip() if calls else text
    return (content or None), calls


class CallGate:
    """Streams an answer's prose as it comes while holding back what may be a tool call: a tail
    that could grow into <tool_call>, and trailing whitespace (dropped if a call follows it).
    From the first <tool_call> on nothing more is sent: the calls are read whole at the end,
    and rest() is what the answer's content holds beyond what was sent."""

    def __init__(self, emit):
        self.emit = emit
        self.text = ""
        self.sent = 0
        self.closed = False

    def push(self, piece: str) -> None:
        self.text += piece
        if self.closed:
            return
        text = self.text
        found = text.find(CALL_OPEN, max(0, self.sent - len(CALL_OPEN)))
        if found >= 0:
            self.closed, upto = True, found
        else:
            upto = len(text) - max((k for k in range(1, len(CALL_OPEN)) if text.endswith(CALL_OPEN[:k])), default=0)
        upto = len(text[:upto].rstrip())
        if upto > self.sent:
            self.emit(text[self.sent:upto])
            self.sent = upto

    def rest(self, content: str | None) -> str | None:
        """The part of the answer's content (parse_calls') not streamed yet."""
        return (content or "")[self.sent:] or None


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates read them (transformers' convention): a call's
    arguments as an object, not the JSON text the API carries."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [{**c, "function": {**c["function"],
                                                       "arguments": _object_or_text(c["function"]["arguments"])}}
                                     for c in calls]}
        out.append(m)
    return out


def _object_or_text(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return arguments
    return arguments


HERMES = ToolFormat("hermes", lambda messages, tools: (template_messages(messages), tools), call_grammar,
                    parse_calls, CallGate)
