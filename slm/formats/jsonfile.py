"""Reading a JSON object from a file someone else wrote: bounded, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slm.errors import InvalidInput, NotFound
from slm.formats.untrusted import read_untrusted


def no_duplicate_keys(pairs):
    """object_pairs_hook: a key given twice is an error (json keeps the last one silently)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def parse_json(text: str, strict_keys: bool = False):
    """json.loads for text someone else wrote: ValueError for anything it cannot read,
    including nesting so deep that the parser runs out of recursion (RecursionError, which
    the C scanner raises cleanly and which would otherwise escape as an internal error)."""
    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys if strict_keys else None)
    except RecursionError as err:
        raise ValueError("nested too deeply") from err


def parse_json_object(data: bytes, what: str, max_bytes: int, strict_keys: bool = False) -> dict:
    """A JSON object from bytes someone else wrote (a bundle's manifest, a signature): bounded,
    one-line errors; `strict_keys`: a key given twice is an error."""
    if len(data) > max_bytes:
        raise InvalidInput(f"{what}: larger than {max_bytes} bytes")
    try:
        doc = parse_json(data.decode("utf-8"), strict_keys)
    except (UnicodeDecodeError, ValueError) as err:
        raise InvalidInput(f"{what}: not JSON ({err})") from err
    if not isinstance(doc, dict):
        raise InvalidInput(f"{what}: not a JSON object")
    return doc


def read_json_object(path: Path, what: str, max_bytes: int, strict_keys: bool = False) -> dict:
    try:
        text = read_untrusted(path, max_bytes, what).decode("utf-8")
    except NotFound as err:
        raise InvalidInput(f"{path.parent.name}: missing {path.name} ({what})") from err
    except UnicodeDecodeError as err:
        raise InvalidInput(f"{path}: {what} is not UTF-8 text") from err
    try:
        data = parse_json(text, strict_keys)
    except ValueError as err:
        raise InvalidInput(f"{path}: {what} is not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: {what} is not a JSON object")
    return data


def canonical_json(obj: Any) -> bytes:
    """One spelling per value: sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")
