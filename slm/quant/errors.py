"""The one error type of the quantization codecs."""

from __future__ import annotations

from slm.errors import InvalidInput


class QuantError(InvalidInput, ValueError):
    """Bad input to a codec: wrong shape or byte length, non-finite values, unknown type.

    A ValueError (callers outside slm can catch it as such) and an InvalidInput (the CLI
    maps it to exit code 4 like every other malformed-input error).
    """
