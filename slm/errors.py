"""Errors that reach the user, each with a documented exit code (docs/exit-codes.md).

Every layer raises a subclass of SlmError; the CLI turns it into one line on stderr and the
exit code below. Anything else escaping is a bug and exits with INTERNAL.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1  # a bug: an exception slm did not expect
    USAGE = 2  # bad command line (unknown option, missing argument)
    NOT_FOUND = 3  # no store, name, digest or file where one was named
    INVALID_INPUT = 4  # malformed or unsupported file, bad name, bad value
    INTEGRITY = 5  # a blob's bytes do not hash to its name, a manifest is corrupt
    INCOMPATIBLE = 6  # a composition was rejected by validation
    BUSY = 7  # another slm process holds the store lock past the timeout
    BUDGET = 8  # the memory estimate exceeds the memory budget
    NEEDS_RECOVERY = 9  # an interrupted transaction: run `slm fsck --repair`
    NUMERICS = 10  # `slm verify`: numbers disagree with the fresh-base oracle
    SWITCHED = 11  # `slm run`: the active composition changed during generation
    IO = 12  # the OS refused a read or write (permissions, disk full, EIO)
    INCOMPLETE = 13  # the change is committed (durable), but finishing it failed: `slm fsck --repair`
    ROLLBACK = 14  # a signed statement's version is lower than the one running
    EQUIVOCATION = 15  # a signed statement gives the running version to another composition
    EXPIRED = 16  # a signed statement's expiry has passed (a freeze)
    WRONG_TARGET = 17  # a signed statement is for another repository, tag or composition
    UNHEALTHY = 18  # `slm health`: a health check of the composition failed
    IN_USE = 19  # `slm rm NAME`: the active composition or a tag uses it (--force removes it)


class SlmError(Exception):
    """An error with a one-line message meant for the user."""

    code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # one line, always, safe to print to any terminal
        return printable(" ".join(self.message.split()))


def printable(text: str, keep: str = "") -> str:
    """Escape what a hostile file could smuggle into a message: control characters (terminal
    escape sequences) and lone surrogates (undecodable bytes in names). Characters in `keep`
    (e.g. newlines of a multi-line text) pass unchanged."""
    out = []
    for ch in text:
        if ch.isprintable() or ch == " " or ch in keep:
            out.append(ch)
        else:
            out.append(ch.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
                       if "\ud800" <= ch <= "\udfff" else repr(ch)[1:-1])
    return "".join(out)


class UsageError(SlmError):
    code = ExitCode.USAGE


class NotFound(SlmError):
    code = ExitCode.NOT_FOUND


class InvalidInput(SlmError):
    code = ExitCode.INVALID_INPUT


class IntegrityError(SlmError):
    code = ExitCode.INTEGRITY


class Incompatible(SlmError):
    code = ExitCode.INCOMPATIBLE


class Busy(SlmError):
    """Try again later: another process holds the store lock, or `slm serve` is full (HTTP 429)."""

    code = ExitCode.BUSY


class ShuttingDown(Busy):
    """`slm serve` is stopping and admits nothing new (HTTP 503): not a place to retry."""


class BudgetExceeded(SlmError):
    code = ExitCode.BUDGET


class NeedsRecovery(SlmError):
    code = ExitCode.NEEDS_RECOVERY


class NumericsError(SlmError):
    code = ExitCode.NUMERICS


class Switched(SlmError):
    code = ExitCode.SWITCHED


class IOFailure(SlmError):
    code = ExitCode.IO


class CommittedIncomplete(SlmError):
    """Raised after a transaction's commit point: the change is durable and will survive, but a
    clean-up step after it failed. Never a plain failure: a script must not retry it."""

    code = ExitCode.INCOMPLETE


class RollbackRefused(SlmError):
    """A signed statement for a tag carries a version lower than the one running."""

    code = ExitCode.ROLLBACK


class EquivocationRefused(SlmError):
    """A signed statement gives the version running to another composition."""

    code = ExitCode.EQUIVOCATION


class StatementExpired(SlmError):
    """A signed statement's expiry time has passed: a registry may be freezing its tag."""

    code = ExitCode.EXPIRED


class WrongTarget(SlmError):
    """A signed statement is for another repository, tag or composition (mix-and-match)."""

    code = ExitCode.WRONG_TARGET


class Unhealthy(SlmError):
    """A health check of a composition failed (`slm health`; the report says which and why)."""

    code = ExitCode.UNHEALTHY


class InUse(SlmError):
    """`slm rm NAME` of a base or adapter the active composition or a tag uses: refused unless
    forced (nothing is lost either way: the objects stay while the composition is reachable)."""

    code = ExitCode.IN_USE
