"""The one "did you mean" of every error about a name that is not there."""

from __future__ import annotations

import difflib


def did_you_mean(word: str, candidates) -> str:
    """"; did you mean 'x'?" (or 'x' or 'y') for the close matches of `word`, else ""."""
    close = difflib.get_close_matches(word, sorted(set(candidates)), n=3, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
