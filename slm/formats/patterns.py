"""PEFT's regular expressions (target_modules, exclude_modules, rank_pattern, alpha_pattern,
layers_pattern) come from files someone else wrote: matched with a time bound.

PEFT matches them with Python's `re`, whose backtracking can run for ever on a pattern like
"(.+)+z". The `regex` package accepts the same syntax (VERSION0 is `re`-compatible) and
takes a timeout per match, so a hostile pattern is refused in a fraction of a second with a
one-line error instead of hanging the import while it holds the store lock.
"""

from __future__ import annotations

import regex

from slm.errors import InvalidInput

MAX_PATTERN_CHARS = 1000
MATCH_TIMEOUT_S = 0.1  # an honest pattern matches a module name in microseconds


def compile_pattern(pattern: str, what: str):
    if not isinstance(pattern, str):
        raise InvalidInput(f"{what} must be a string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidInput(f"{what} is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS}")
    try:
        return regex.compile(pattern, regex.VERSION0)
    except (regex.error, OverflowError, RecursionError) as err:
        raise InvalidInput(f"{what} {pattern!r} is not a valid regular expression ({err})") from err


def _bounded(method, pattern: str, text: str, what: str):
    try:
        return method(text, timeout=MATCH_TIMEOUT_S)
    except TimeoutError as err:
        raise InvalidInput(f"{what} {pattern[:80]!r} takes too long to match a module name "
                           "(catastrophic backtracking?); simplify it") from err


def fullmatch(pattern: str, text: str, what: str = "pattern") -> bool:
    compiled = compile_pattern(pattern, what)
    return _bounded(compiled.fullmatch, pattern, text, what) is not None


def match(pattern: str, text: str, what: str = "pattern"):
    compiled = compile_pattern(pattern, what)
    return _bounded(compiled.match, pattern, text, what)
