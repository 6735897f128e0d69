"""Tool calls for Gemma 3, whose chat template never reads `tools` (Google's own does not; nor
does slm's fallback for GGUFs without a template, slm.model.chat.GEMMA3_TEMPLATE): Gemma 3
calls functions through its prompt alone, as Google's function-calling guide describes
(ai.google.dev/gemma/docs/capabilities/function-calling). The guide's JSON variant:

- the instruction and the function definitions (a JSON list of {name, description,
  parameters}) open the first user turn (slm puts them in the system text, which Gemma's
  template writes there);
- a call is the answer itself, a JSON object {"name": ..., "parameters": {...}}, with no other
  text (slm reads one object a line, or a JSON list of them, optionally in a ``` fence);
- earlier calls are written back in that form in the model's turn, and tool results as JSON
  lines {"name", "response"} in a user turn (Gemma's turns alternate user/model).

tool_choice "required" or a named function constrains the answer with a grammar (one call, or
one a line), as for the Hermes-style templates; the arguments are valid under the function's
parameters schema.
"""

from __future__ import annotations

import json

from slm.engine.tools import ParsedCall, _object_or_text, call_schema

# Google's wording (the guide's JSON variant)
INSTRUCTION = ("You have access to functions. If you decide to invoke any of the function(s), you MUST put it in "
               "the format of\n{\"name\": function name, \"parameters\": dictionary of argument name and its value}\n\n"
               "You SHOULD NOT include any other text in the response if you call a function\n")


def uses_gemma_turns(template: str) -> bool:
    """A Gemma-style template: <start_of_turn> turns (Gemma 3's own, or slm's fallback for it)."""
    return "<start_of_turn>" in template


def prompt_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation with the tools in its system text, calls and results as Gemma reads them."""
    functions = "[\n" + ",\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools) + "\n]"
    preamble = INSTRUCTION + functions
    names = {}  # call id -> function name (a result names the function it answers)
    out: list[dict] = []
    if not messages or messages[0]["role"] != "system":
        out.append({"role": "system", "content": preamble})
    for m in messages:
        role, content = m["role"], m.get("content")
        if role == "system" and not out:
            out.append({"role": "system", "content": preamble + "\n\n" + (content or "")})
            continue
        if role == "assistant" and m.get("tool_calls"):
            lines = [content] if content else []
            for c in m["tool_calls"]:
                f = c["function"]
                names[c.get("id")] = f["name"]
                lines.append(json.dumps({"name": f["name"], "parameters": _object_or_text(f["arguments"])},
                                        ensure_ascii=False))
            out.append({"role": "assistant", "content": "\n".join(lines)})
            continue
        if role == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id"), "")
            role, content = "user", json.dumps({"name": name, "response": _object_or_text(content)},
                                               ensure_ascii=False)
        if role == "user" and out and out[-1]["role"] == "user":  # results, then a question: one user turn
            out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + (content or "")}
            continue
        out.append({"role": role, "content": content})
    return out


def call_grammar(tools: list[dict], name: str | None, parallel: bool) -> str:
    """The llguidance grammar of an answer that is only calls: one, or with `parallel` one a line."""
    from llguidance import LLMatcher

    schema = call_schema(tools, name, "parameters")
    more = ' ("\\n" call)*' if parallel else ""
    return LLMatcher.grammar_from_lark("\n".join([f"start: call{more}", f"call: %json {json.dumps(schema)}"]))


def parse_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """The calls an answer opens with (JSON objects {"name", "parameters"}, one a line, or a
    list of them; a ``` fence around them allowed) and the rest as content (None if nothing is
    left: an answer cut inside its last call keeps that one as content). An answer that does not
    open with a call is all content: (text, [])."""
    body = text.strip()
    if body.startswith("```") and body.endswith("```") and len(body) >= 6:
        first_line, _, rest = body[3:-3].partition("\n")
        body = (rest if first_line.strip().isidentifier() else body[3:-3]).strip()  # ```json, ```tool_code
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            value, end = decoder.raw_decode(body, at)
        except (json.JSONDecodeError, RecursionError):
            break
        found = [_call(v) for v in value] if isinstance(value, list) and value else [_call(value)]
        if any(c is None for c in found):
            break
        calls += found
        at = end
        while at < len(body) and body[at].isspace():
            at += 1
    if not calls:
        return (text or None), []
    return (body[at:].strip() or None), calls


def _call(value) -> ParsedCall | None:
    if not (isinstance(value, dict) and isinstance(value.get("name"), str) and value["name"]):
        return None
    if set(value) - {"name", "parameters", "arguments"}:
        return None
    args = value.get("parameters", value.get("arguments", {}))
    if isinstance(args, str):
        return ParsedCall(value["name"], args)
    if not isinstance(args, dict):
        return None
    return ParsedCall(value["name"], json.dumps(args, ensure_ascii=False))


class CallGate:
    """Streams an answer that is prose as it comes; holds back one that may be calls (its first
    visible character opens JSON or a fence), to be read whole at the end. rest() is what the
    answer's content holds beyond what was sent."""

    def __init__(self, emit):
        self.emit = emit
        self.text = ""
        self.sent = 0
        self.held = None  # None: undecided; True: may be calls; False: prose

    def push(self, piece: str) -> None:
        self.text += piece
        if self.held is None:
            visible = self.text.lstrip()
            if not visible:
                return
            self.held = visible[0] in "{[`"
        if not self.held and len(self.text) > self.sent:
            self.emit(self.text[self.sent:])
            self.sent = len(self.text)

    def rest(self, content: str | None) -> str | None:
        return (content or "")[self.sent:] or None
