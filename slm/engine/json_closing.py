"""The shortest text that completes a prefix of compact JSON: what an answer bound by a JSON
grammar (response_format, slm.engine.grammar) is closed with when its max_tokens would otherwise
cut it in the middle of a structure.

    {"name":"Fluffy","tags":["a","b      ->  "]}
    {"name":"Rex","age":1.              ->  0}
    {"name":"Rex","owner               ->  ":null}

Only the structure is read (strings, numbers, literals, nesting); whether the closing is allowed
is the grammar's to say: the mask validates the closing against the row's own matcher before it
forces a token of it, so a schema that requires more (a required key, an enum) is never forced
into an answer it forbids.
"""

from __future__ import annotations

_LITERALS = ("true", "false", "null")
_SCALAR = frozenset("0123456789+-.eEtrufalsn")
_HEX = frozenset("0123456789abcdefABCDEF")
_CLOSE = {"{": "}", "[": "]"}


def closing(text: str) -> str | None:
    """The closing of `text`, a prefix of one compact JSON value ("" if it is whole), or None
    if `text` is not such a prefix (whitespace included: the grammars here allow none)."""
    if not text:
        return "{}"
    stack: list[str] = []
    # what may come next: "value" (after ':', or ',' in an array), "key" (after ',' in an
    # object), "first" (after '{' or '[': a member or item, or the close), "colon", "comma"
    # (after a member or item: ',' or the close), "done"
    expect = "value"
    in_string = is_key = escaped = False
    hex_left = 0
    scalar = ""
    for c in text:
        if in_string:
            if hex_left:
                if c not in _HEX:
                    return None
                hex_left -= 1
            elif escaped:
                escaped, hex_left = False, 4 if c == "u" else 0
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string, expect = False, "colon" if is_key else "comma"
            continue
        if scalar and c in _SCALAR:
            scalar += c
            continue
        if scalar:
            scalar, expect = "", "comma"
        opens_value = expect == "value" or (expect == "first" and stack[-1] == "[")
        if c in "{[" and opens_value:
            stack.append(c)
            expect = "first"
        elif c == '"' and (opens_value or expect == "key" or expect == "first"):
            in_string, is_key = True, not opens_value
        elif c == ":" and expect == "colon":
            expect = "value"
        elif c == "," and expect == "comma" and stack:
            expect = "key" if stack[-1] == "{" else "value"
        elif c in "}]" and stack and c == _CLOSE[stack[-1]] and expect in ("comma", "first"):
            stack.pop()
            expect = "comma" if stack else "done"
        elif c in _SCALAR and opens_value:
            scalar = c
        else:
            return None
    out = ""
    if in_string:
        out += ("n" if escaped else "") + "0" * hex_left + '"'
        expect = "colon" if is_key else "comma"
    if scalar:
        word = next((w for w in _LITERALS if w.startswith(scalar)), None)
        if word is not None:
            out += word[len(scalar):]
        elif scalar[-1] in "+-.eE":
            out += "0"
        expect = "comma"
    out += {"colon": ":null", "value": "null", "key": '"":null'}.get(expect, "")
    return out + "".join(_CLOSE[s] for s in reversed(stack))
