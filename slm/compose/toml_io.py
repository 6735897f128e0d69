"""Reading and writing manifest TOML, with errors that name the manifest.

Reading uses the standard library's tomllib (strict TOML 1.0; tomlkit's style-preserving
parser is many times slower, and every `slm activate` reads manifests). Writing: the
manifests' digests depend on every byte, so the bytes are tomlkit's; for the shapes a base or
adapter manifest has (scalars, then tables of scalars, arrays of tables whose entries hold
scalars and tables of scalars) `_plain_dumps` writes those same bytes itself, without
tomlkit's per-item overhead on a manifest of hundreds of tensors, and anything else goes to
tomlkit, imported only then. tests/unit/test_toml_io.py holds the two to the same bytes.
"""

from __future__ import annotations

import math
import re
import tomllib

from slm.errors import InvalidInput

MAX_MANIFEST = 16 << 20


def dumps(doc: dict) -> bytes:
    text = _plain_dumps(doc)
    if text is None:
        import tomlkit

        text = tomlkit.dumps(doc)
    return text.encode("utf-8")


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_PLAIN_STRING = re.compile(r"[ !#-\[\]-~]*")  # printable ASCII but the quote and the backslash


def _scalar(value) -> str | None:
    """A value as tomlkit writes it, or None outside the plain subset."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return str(value)
    if type(value) is float:
        return repr(value) if math.isfinite(value) else None
    if type(value) is str:
        return f'"{value}"' if _PLAIN_STRING.fullmatch(value) else None
    if type(value) is list and all(type(v) is not list and type(v) is not dict for v in value):
        items = [_scalar(v) for v in value]
        return None if None in items else "[" + ", ".join(items) + "]"
    return None


def _is_table(value) -> bool:
    return type(value) is dict


def _is_array_of_tables(value) -> bool:
    return type(value) is list and bool(value) and all(type(v) is dict for v in value)


def _lines(table: dict) -> list[str] | None:
    """`key = value` lines of a table that holds only scalars (non-empty), else None."""
    if not table:
        return None
    out = []
    for key, value in table.items():
        text = _scalar(value) if _BARE_KEY.fullmatch(key) else None
        if text is None:
            return None
        out.append(f"{key} = {text}\n")
    return out


def _split(table: dict) -> tuple[dict, dict] | None:
    """(scalars, the rest) of a table whose scalars all come first, else None."""
    scalars, rest = {}, {}
    for key, value in table.items():
        if _is_table(value) or _is_array_of_tables(value):
            rest[key] = value
        elif rest:
            return None  # a scalar after a table: tomlkit moves it; left to tomlkit
        else:
            scalars[key] = value
    return scalars, rest


def _plain_dumps(doc: dict) -> str | None:
    parts = _split(doc)
    if parts is None:
        return None
    scalars, rest = parts
    out = _lines(scalars) if scalars else []
    if out is None:
        return None
    for key, value in rest.items():
        if not _BARE_KEY.fullmatch(key):
            return None
        if _is_table(value):
            body = _lines(value)
            if body is None:
                return None
            out += (["\n"] if out else []) + [f"[{key}]\n"] + body
            continue
        for entry in value:  # an array of tables
            entry_parts = _split(entry)
            if entry_parts is None or not entry_parts[0]:
                return None  # an entry with no scalar: tomlkit writes no blank line after [[key]]
            body = _lines(entry_parts[0])
            if body is None:
                return None
            out += (["\n"] if out else []) + [f"[[{key}]]\n"] + body
            for sub, table in entry_parts[1].items():
                sub_lines = _sub_tables(f"{key}.{sub}", table) if _BARE_KEY.fullmatch(sub) else None
                if sub_lines is None:
                    return None
                out += sub_lines
    return "".join(out)


def _sub_tables(path: str, table) -> list[str] | None:
    """A table inside an array-of-tables entry: one of scalars ([path]), or one whose values
    are all tables of scalars (a super table: [path.name] headers only, as tomlkit writes it)."""
    if not _is_table(table) or not table:
        return None
    body = _lines(table)
    if body is not None:
        return ["\n", f"[{path}]\n"] + body
    out = []
    for name, inner in table.items():
        body = _lines(inner) if _is_table(inner) and _BARE_KEY.fullmatch(name) else None
        if body is None:
            return None
        out += ["\n", f"[{path}.{name}]\n"] + body
    return out


def loads(data: bytes, what: str) -> dict:
    if len(data) > MAX_MANIFEST:
        raise InvalidInput(f"{what}: larger than {MAX_MANIFEST >> 20} MB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidInput(f"{what}: not UTF-8 text") from err
    doc = _plain_loads(text)
    if doc is not None:
        return doc
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        raise InvalidInput(f"{what}: not valid TOML ({' '.join(str(err).split())})") from err


# Reading the plain shapes back. tomllib is pure Python, and the manifests of a base and an
# adapter (a line per field, hundreds of tensors) are read by every `slm activate`, a new
# process each time. `_plain_loads` reads the lines `_plain_dumps` writes (and only those: one
# `key = value` or header per line, bare keys, strings without escapes, no comments, no
# inline tables) into exactly the document tomllib gives, and returns None for anything else,
# which tomllib then reads (or refuses). tests/unit/test_toml_io.py compares the two on generated
# and damaged texts.
_STRING_BODY = re.compile(r"[ !#-\[\]-~]*")  # printable ASCII but the quote and the backslash
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+(?:[eE][+-]?[0-9]+)?|[eE][+-]?[0-9]+)")
_ITEM = re.compile(r'"[ !#-\[\]-~]*"|true|false|[-0-9][-+.eE0-9]*')  # one array item, checked by _scalar_of
_NO_VALUE = object()


def _scalar_of(text: str):
    """The value of one scalar spelt as `_plain_dumps` spells it, else _NO_VALUE."""
    first = text[:1]
    if first == '"':
        if len(text) >= 2 and text[-1] == '"' and _STRING_BODY.fullmatch(text, 1, len(text) - 1):
            return text[1:-1]
        return _NO_VALUE
    if text == "true":
        return True
    if text == "false":
        return False
    if _INTEGER.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return _NO_VALUE


def _value_of(text: str):
    if text[:1] != "[":
        return _scalar_of(text)
    if text == "[]":
        return []
    items, pos, end = [], 1, len(text) - 1
    if text[-1] != "]":
        return _NO_VALUE
    while True:
        m = _ITEM.match(text, pos, end)
        if m is None:
            return _NO_VALUE
        item = _scalar_of(m.group())
        if item is _NO_VALUE:
            return _NO_VALUE
        items.append(item)
        pos = m.end()
        if pos == end:
            return items
        if not text.startswith(", ", pos):
            return _NO_VALUE
        pos += 2


def _plain_loads(text: str) -> dict | None:
    doc: dict = {}
    arrays: set[str] = set()  # root keys made by [[name]]
    current = doc
    # A manifest spells the same keys, values and headers on every entry (`dtype = "f32"`,
    # `shape = [16, 576]`, `[targets.tensors.A]`): each spelling is checked and read once per
    # text (half the parse of an adapter's 3,600 lines); a list is kept as a tuple and each use
    # gets its own list
    bare_keys: set[str] = set()
    spelt_values: dict[str, object] = {}
    header_paths: dict[str, list[str]] = {}
    for line in text.split("\n"):
        if not line:
            continue
        if line[0] != "[":
            key, sep, spelt = line.partition(" = ")
            if not sep or key in current:
                return None
            if key not in bare_keys:
                if not _BARE_KEY.fullmatch(key):
                    return None
                bare_keys.add(key)
            value = spelt_values.get(spelt, _NO_VALUE)
            if value is _NO_VALUE:
                value = _value_of(spelt)
                if value is _NO_VALUE:
                    return None
                spelt_values[spelt] = tuple(value) if type(value) is list else value
            elif type(value) is tuple:
                value = list(value)
            current[key] = value
            continue
        if line.startswith("[["):
            name = line[2:-2]
            if not line.endswith("]]") or not _BARE_KEY.fullmatch(name) or (name in doc and name not in arrays):
                return None
            arrays.add(name)
            current = {}
            doc.setdefault(name, []).append(current)
            continue
        path = header_paths.get(line)
        if path is None:
            if not line.endswith("]") or line.endswith("]]"):
                return None
            path = line[1:-1].split(".")
            if not all(_BARE_KEY.fullmatch(part) for part in path):
                return None
            header_paths[line] = path
        if len(path) == 1:
            if path[0] in doc:
                return None
            current = doc[path[0]] = {}
            continue
        # [name.sub...]: a table in the last entry of the array of tables `name`
        if path[0] not in arrays:
            return None
        table = doc[path[0]][-1]
        for part in path[1:-1]:  # intermediate tables: made by an earlier header, or made now
            table = table.setdefault(part, {})
            if type(table) is not dict:
                return None
        if path[-1] in table:  # defined again, or defined after its sub-tables: tomllib decides
            return None
        current = table[path[-1]] = {}
    return doc


def field(doc: dict, key: str, kind: type | tuple[type, ...], what: str):
    """doc[key], which must exist and be of `kind` (bool is not accepted as int)."""
    value = doc.get(key, _NO_VALUE)
    if type(value) is kind:  # the common case, at once (a manifest has thousands of fields)
        return value
    if key not in doc:
        raise InvalidInput(f"{what}: missing field {key!r}")
    value = doc[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidInput(f"{what}: field {key!r} has the wrong type (bool)")
    if not isinstance(value, kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise InvalidInput(f"{what}: field {key!r} must be {names}, not {type(value).__name__}")
    return value
