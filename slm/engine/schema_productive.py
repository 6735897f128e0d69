"""Whether a JSON schema, read as a grammar, derives any finite document: a productivity analysis.

A schema is a grammar whose rules are its subschemas: `$ref` and `allOf` are parts that must all
be derived, `anyOf`/`oneOf` and the types `type` allows are alternatives, an object's required
properties and an array's first `minItems` items are parts of that type's alternative. A rule is
productive if one of its alternatives derives a finite document from productive parts only; the
schema accepts a finite document iff its root is productive. `{"$ref": "#"}`, a `$ref` cycle
`a -> b -> a`, or an object that requires a property of its own type has no productive root:
constrained decoding under it can only stop empty or run to max_tokens, so it is refused before
any generation (InvalidInput: HTTP 400, exit 4).

The analysis is a least fixpoint: nothing is productive at first, and a rule becomes productive
when its formula holds over the rules already known productive. It runs in rounds: all rules,
then in each round only the rules one of whose parts became productive in the round before (once
each, however many of its parts did), so a request's schema, bounded in size, cannot make it
quadratic by listing many parts that turn productive one by one. It is conservative: a keyword
it does not model (a `pattern`, `not`, `if`, a bound on a string) never makes a rule
unproductive, so it refuses only a schema that surely accepts nothing, and leaves the rest to
the engine (slm.engine.grammar), whose own refusals stand, and to the stop rules, which
never report an answer its grammar rejects as one that ended by itself (slm.engine.stops).

`$ref`s resolve against the schema's own root ("#" and JSON pointers "#/..."); a reference this
cannot follow counts as productive (the engine says what is wrong with it).
"""

from __future__ import annotations

from urllib.parse import unquote

_UNKNOWN = object()  # a part this analysis does not follow: productive


def accepts_a_document(schema) -> bool:
    """Whether some finite JSON document is valid under `schema` as far as its structure can tell."""
    if not isinstance(schema, dict):
        return schema is not False
    rules: dict[int, dict] = {}
    users: dict[int, list[int]] = {}  # rule -> the rules whose formula reads it
    todo = [schema]
    while todo:
        rule = todo.pop()
        if id(rule) in rules:
            continue
        rules[id(rule)] = rule
        for part in _parts(rule, schema):
            if isinstance(part, dict):
                users.setdefault(id(part), []).append(id(rule))
                todo.append(part)
    productive: set[int] = set()
    frontier = list(rules)  # the rules to evaluate this round: at first all, then only those a part of
    while frontier:         # which became productive in the round before (each queued once a round)
        found = [key for key in frontier if _holds(rules[key], schema, productive)]
        productive.update(found)
        frontier = list({user for key in found for user in users.get(key, ())} - productive)
    return id(schema) in productive


def _ok(part, productive: set[int]) -> bool:
    if isinstance(part, dict):
        return id(part) in productive
    return part is not False


def _holds(rule: dict, root: dict, productive: set[int]) -> bool:
    """The rule's formula over the rules known productive so far."""
    ok = lambda part: _ok(part, productive)  # noqa: E731
    if "$ref" in rule and not ok(_resolve(rule["$ref"], root)):
        return False
    if not all(ok(s) for s in _list(rule.get("allOf"))):
        return False
    for key in ("anyOf", "oneOf"):
        if isinstance(rule.get(key), list) and not any(ok(s) for s in rule[key]):
            return False
    if isinstance(rule.get("enum"), list) and not rule["enum"]:
        return False
    if "const" in rule or "enum" in rule:
        return True  # a listed value is a finite document (whether it fits the rest is the engine's)
    types = rule.get("type")
    if types is None:
        return True  # any type: null is a finite document
    types = [types] if isinstance(types, str) else _list(types)
    return any(_type_holds(t, rule, root, ok) for t in types)


def _type_holds(kind, rule: dict, root: dict, ok) -> bool:
    if kind == "object":
        return all(ok(_property(rule, name)) for name in _required(rule))
    if kind == "array":
        return all(ok(s) for s in _array_items(rule))
    return True


def _parts(rule: dict, root: dict) -> list:
    """Every subschema the rule's formula reads."""
    found = []
    if "$ref" in rule:
        found.append(_resolve(rule["$ref"], root))
    for key in ("allOf", "anyOf", "oneOf"):
        found += _list(rule.get(key))
    found += [_property(rule, name) for name in _required(rule)]
    found += _array_items(rule)
    return found


def _required(rule: dict) -> list[str]:
    return [name for name in _list(rule.get("required")) if isinstance(name, str)]


def _property(rule: dict, name: str):
    """The schema a required property's value must meet."""
    props = rule.get("properties")
    if isinstance(props, dict) and name in props:
        return props[name]
    if rule.get("patternProperties"):
        return _UNKNOWN
    return rule.get("additionalProperties", True)


def _array_items(rule: dict) -> list:
    """The schemas of the items an array must have (its first minItems)."""
    least = rule.get("minItems")
    if not isinstance(least, int) or isinstance(least, bool) or least <= 0:
        return []
    prefix = _list(rule.get("prefixItems"))
    if isinstance(rule.get("items"), list):  # the draft-07 form of prefixItems
        prefix = rule["items"]
    needed = prefix[:least]
    if least > len(prefix) and isinstance(rule.get("items"), (dict, bool)):
        needed.append(rule["items"])
    return needed


def _resolve(ref, root: dict):
    """The subschema a local reference names, or _UNKNOWN."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return _UNKNOWN
    pointer = unquote(ref[1:])
    if pointer == "":
        return root
    if not pointer.startswith("/"):
        return _UNKNOWN  # an anchor name
    node = root
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _UNKNOWN
    return node


def _list(value) -> list:
    return value if isinstance(value, list) else []
