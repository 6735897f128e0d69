"""The checksummed line: how refs/active, each journal intent and each reflog line is written.

    <body> <check>\n     check = the first 16 hex digits of BLAKE3(body)

The body is ASCII text on one line (its fields are each file's business: refs.py, journal.py,
reflog.py). A line is intact only whole: its newline at the end, ASCII throughout, a check
after its last space, and that check matching the body. Anything else (a torn tail, a flipped
bit, a line without a check) decodes to None, and the reader says what that means for its file.
"""

from __future__ import annotations

from slm.store import digest as dg

CHECK_HEX = 16


def check_of(body: str) -> str:
    return dg.of_bytes(body.encode("ascii"))[len(dg.PREFIX):][:CHECK_HEX]


def encode(body: str) -> bytes:
    """One line: `body`, a space, its check, a newline."""
    if "\n" in body:
        raise ValueError("a checksummed line's body is one line")  # a caller's bug
    return f"{body} {check_of(body)}\n".encode("ascii")


def decode(line: bytes) -> str | None:
    """The body of one whole line (its newline included), or None if the line is not intact."""
    if not line.endswith(b"\n") or b"\n" in line[:-1]:
        return None
    try:
        text = line[:-1].decode("ascii")
    except UnicodeDecodeError:
        return None
    body, space, check = text.rpartition(" ")
    if not space or check != check_of(body):
        return None
    return body
