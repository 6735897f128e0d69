"""The one grammar of the numbers a user types: command-line options, adapter weights
(`NAME@WEIGHT`, and a server request's `BASE+NAME@WEIGHT`). ASCII decimal only:

    INTEGER = [+|-] DIGITS
    DECIMAL = [+|-] (DIGITS [. [DIGITS]] | . DIGITS) [(e|E) [+|-] DIGITS]
    DIGITS  = one or more of 0-9

Python's int() and float() are not the grammar: they also take "1_0" (as 10), Arabic-Indic,
full-width and other Unicode digits, and surrounding spaces; float() takes "inf", "nan" and
"infinity" too. A leaf module (only `re`): the command line imports it at start-up.
"""

from __future__ import annotations

import re

INTEGER_GRAMMAR = "an integer in ASCII digits 0-9"
DECIMAL_GRAMMAR = "a decimal number in ASCII digits 0-9, e.g. 0.8, -0.5, .5, 1e-3"
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_NON_FINITE = re.compile(r"[+-]?(?:inf|infinity|nan)", re.ASCII | re.IGNORECASE)


def is_decimal(text: str) -> bool:
    return isinstance(text, str) and _DECIMAL.fullmatch(text) is not None


def integer(text) -> int:
    """An INTEGER; ValueError otherwise (the command line turns it into a usage error)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text  # a default, already a number
    if not (isinstance(text, str) and _INTEGER.fullmatch(text)):
        raise ValueError(f"{text!r} is not {INTEGER_GRAMMAR}")
    return int(text)


def decimal(text, non_finite_words: bool = False) -> float:
    """A DECIMAL; ValueError otherwise. non_finite_words: "inf" / "nan" are also read, for an
    option whose own check refuses a non-finite value with a message that names the option."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)  # a default, already a number
    if isinstance(text, str) and (_DECIMAL.fullmatch(text) or (non_finite_words and _NON_FINITE.fullmatch(text))):
        return float(text)
    raise ValueError(f"{text!r} is not {DECIMAL_GRAMMAR}")


# The command line's parsers (typer's `parser=`): a ValueError becomes a usage error (exit 2),
# and --help shows each function's name as the option's type.
def option_integer(text) -> int:
    return integer(text)


def option_decimal(text) -> float:
    return decimal(text, non_finite_words=True)  # inf / nan: refused by each option's own check


option_integer.__name__, option_decimal.__name__ = "int", "float"
