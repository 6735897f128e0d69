"""The public API's one argument check (`checked`, on slm.api.Store, its StoreNames and
slm.api.Runtime): a call with an unknown keyword, a missing or an extra argument is a UsageError,
and an argument of a type its annotation does not allow is InvalidInput, as a bad command line
is for the CLI; never a raw TypeError (or worse, a wrong answer) from deep inside an operation.

Annotations are read as written (strings, under `from __future__ import annotations`): each
`|` alternative naming a class the method's module can see (`str`, `int`, `os.PathLike`,
`Composition`, `Store`), or `Sequence[...]` of one, is checked; an alternative that names
anything else (a type imported only for type checkers, `Callable[...]`, `dict[...]`) lets any
value through, so the check is never stricter than the signature. `bool` is not taken for an
`int` or a `float` (a flag passed where a number belongs is a mistake, not a 1).
"""

from __future__ import annotations

import builtins
import functools
import inspect
from typing import Any

from slm.errors import InvalidInput, UsageError

_ANY = object()  # an alternative this check does not judge


def checked(cls: type) -> type:
    """Wrap every public method of `cls` (and __init__; classmethods too) in the check."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, classmethod):
            setattr(cls, name, classmethod(_checking(cls, member.__func__)))
        elif inspect.isfunction(member):
            setattr(cls, name, _checking(cls, member))
    return cls


def _checking(cls: type, fn):
    signature = inspect.signature(fn)
    what = f"{cls.__name__}.{fn.__name__}()" if fn.__name__ != "__init__" else f"{cls.__name__}()"

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:
            raise UsageError(f"{what}: {err}") from None
        for name, value in bound.arguments.items():
            param = signature.parameters[name]
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.annotation is param.empty:
                continue
            if not _allows(str(param.annotation), value, fn.__globals__):
                raise InvalidInput(f"{what}: {name} must be {param.annotation}, not {type(value).__name__}")
        return fn(*args, **kwargs)
    return call


def _allows(annotation: str, value: Any, scope: dict) -> bool:
    for alternative in _split(annotation):
        judged = _judge(alternative, value, scope)
        if judged is _ANY or judged:
            return True
    return False


def _judge(alternative: str, value: Any, scope: dict):
    if alternative == "None":
        return value is None
    if alternative.startswith("Sequence[") and alternative.endswith("]"):
        if not isinstance(value, (list, tuple)):
            return False
        item = alternative[len("Sequence["):-1]
        return all(_allows(item, v, scope) for v in value)
    kind = _resolve(alternative, scope)
    if kind is None:
        return _ANY
    if kind in (int, float) and isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _resolve(name: str, scope: dict) -> type | None:
    """The class a dotted name means in a module (`os.PathLike`), None if it means none there."""
    head, *rest = name.split(".")
    if not head.isidentifier():
        return None
    found = scope.get(head, getattr(builtins, head, None))
    for part in rest:
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None


def _split(annotation: str) -> list[str]:
    """`a | b[c | d] | e` -> ["a", "b[c | d]", "e"]: the top-level alternatives."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(annotation):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "|" and depth == 0:
            out.append(annotation[start:i].strip())
            start = i + 1
    out.append(annotation[start:].strip())
    return out
