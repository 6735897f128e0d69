"""Reading and writing manifest TOML, with errors that name the manifest.

Reading uses the standard library's tomllib (strict TOML 1.0, and about 20x faster than
tomlkit's style-preserving parser: that parse was 0.3 s of every `slm activate`); writing
uses tomlkit, imported only when a manifest is written.
"""

from __future__ import annotations

import tomllib

from slm.errors import InvalidInput

MAX_MANIFEST = 16 << 20


def dumps(doc: dict) -> bytes:
    import tomlkit

    return tomlkit.dumps(doc).encode("utf-8")


def loads(data: bytes, what: str) -> dict:
    if len(data) > MAX_MANIFEST:
        raise InvalidInput(f"{what}: larger than {MAX_MANIFEST >> 20} MB")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise InvalidInput(f"{what}: not UTF-8 text") from err
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        raise InvalidInput(f"{what}: not valid TOML ({' '.join(str(err).split())})") from err


def field(doc: dict, key: str, kind: type | tuple[type, ...], what: str):
    """doc[key], which must exist and be of `kind` (bool is not accepted as int)."""
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
