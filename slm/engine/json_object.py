"""The grammar of `response_format: json_object`: any JSON object, within bounds.

`{"type": "object"}` compiled as it is lets every structure grow without end, and small models,
sampled, loop inside one: a string that repeats a phrase, a number's digits, the same member
again, an object in an object in an object. Such an answer runs to max_tokens and is cut, so it
does not parse. This grammar is JSON with every structure bounded, so a loop is ended by the
grammar (the string must close, the object must close) and the answer still parses:

- nesting: at most MAX_DEPTH objects/arrays one in another (the answer itself is the first);
- an object at depth d (the answer is at depth 1): at most MEMBERS_AT_DEPTH[d - 1] members; an
  array: at most ITEMS_AT_DEPTH[d - 1] items. The bounds narrow with depth: a document's
  breadth is at its top, and a loop one level down (an object's members repeated inside each
  item of a list, say) is what runs longest, each level multiplying the one above;
- a key: at most MAX_KEY_CHARS characters, a string value at most MAX_STRING_CHARS (an escape
  counts as one); a number: at most MAX_INT_DIGITS digits before the point, MAX_FRACTION_DIGITS
  after it, MAX_EXPONENT_DIGITS in its exponent.

What a grammar cannot forbid is a repeated key: "no key twice" over keys of any spelling is not
context-free, and JSON schema has no such keyword (uniqueItems is for arrays' items); the
member bound is what ends a member repeated, so a loop of long members at the top can still
reach a small max_tokens. A document beyond these bounds needs a json_schema response format
(docs/serve.md, "Structured output").

The bounds count characters, not tokens: llguidance's Lark form can bound a lexeme in tokens
(`body[max_tokens=N]`), but it ends the lexeme wherever the count runs out, inside an escape
too (a backslash, then the forced closing quote, which the backslash escapes).

The grammar is llguidance's Lark form; its lexemes are compact JSON (no whitespace between
tokens: with whitespace allowed a weak model can spend its budget on spaces), as the json_schema
grammar is (slm.engine.grammar.JSON_OPTIONS).
"""

from __future__ import annotations

import functools

MEMBERS_AT_DEPTH = (10, 6, 4, 3)
ITEMS_AT_DEPTH = (12, 8, 6, 4)
MAX_DEPTH = len(MEMBERS_AT_DEPTH)
MAX_KEY_CHARS = 32
MAX_STRING_CHARS = 100
MAX_INT_DIGITS = 15
MAX_FRACTION_DIGITS = 8
MAX_EXPONENT_DIGITS = 3

# One character of a JSON string: anything but a quote, a backslash or a control character,
# or one escape.
_CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{4})'


def _string(max_chars: int) -> str:
    return f'/"{_CHAR}{{0,{max_chars}}}"/'


def _number() -> str:
    return (rf"/-?(?:0|[1-9][0-9]{{0,{MAX_INT_DIGITS - 1}}})(?:\.[0-9]{{1,{MAX_FRACTION_DIGITS}}})?"
            rf"(?:[eE][+-]?[0-9]{{1,{MAX_EXPONENT_DIGITS}}})?/")


def json_object_lark() -> str:
    """The Lark text of the bounded grammar: obj1 is the answer, value{d} a value inside a
    container at depth d (at MAX_DEPTH a value is a scalar)."""
    lines = ["start: obj1", f"KEY: {_string(MAX_KEY_CHARS)}", f"STRING: {_string(MAX_STRING_CHARS)}",
             f"NUMBER: {_number()}", 'scalar: STRING | NUMBER | "true" | "false" | "null"']
    for depth in range(1, MAX_DEPTH + 1):
        members, items = MEMBERS_AT_DEPTH[depth - 1], ITEMS_AT_DEPTH[depth - 1]
        lines += [f'obj{depth}: "{{" (KEY ":" value{depth} ("," KEY ":" value{depth}){{0,{members - 1}}})? "}}"',
                  f'arr{depth}: "[" (value{depth} ("," value{depth}){{0,{items - 1}}})? "]"']
        deeper = f" | obj{depth + 1} | arr{depth + 1}" if depth < MAX_DEPTH else ""
        lines.append(f"value{depth}: scalar{deeper}")
    return "\n".join(lines) + "\n"


@functools.cache
def json_object_grammar() -> str:
    """The bounded grammar in llguidance's grammar JSON, as compile_grammar takes it (built once:
    it is the same for every request)."""
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_lark(json_object_lark())
