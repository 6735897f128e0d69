"""One store transaction: the journal protocol, written once (git has one lockfile API).

    with store.transaction("active", "activate", new, old=old, created=created,
                           done=f"the transition to {short} is committed") as tx:
        tx.on_undo(take_back_the_blobs)       # registered before the work it takes back
        ... work nobody can see yet ...
        tx.commit(append_the_reflog_line)     # THE COMMIT POINT
        ... finishing work (refs/active) ...
    # leaving the block clears the intent

    begin: journal/<name>.intent written (fsynced) before anything else is
    before the commit point: any failure (Ctrl-C included) is undone, newest step first,
        the intent cleared, and the error raised as it was: the store is as it was. If the
        undo fails too, the intent stays and the error says so: `slm fsck --repair` takes the
        same decision from what is on disk.
    the commit point: one durable step (a reflog line, the rename of a name file). If it
        fails but `landed` says it happened anyway (the rename was done, its directory's
        fsync failed), the transaction is committed.
    after it: the change survives whatever happens. A failure of the finishing work or of
        clearing the intent raises CommittedIncomplete (exit 13, never a plain failure a
        script would retry) and leaves the intent for `slm fsck --repair` to finish.

Two variations, both stated where the transaction is opened:

    journaled=False   no intent: a crash before the commit point leaves only blobs no name
                      reaches (for `slm gc`), so there is nothing to repair (signing).
    undoable=False    no undo and no commit point: each step is final on its own (gc removes
                      only unreachable data); a failure leaves the intent and raises as it is,
                      `slm fsck --repair` clears the intent and the next run finishes the work.

After a crash, the intent names its transaction's kind (slm.store.journal.intent_name), and the
kind's own `recover(store, intent, seen) -> Recovery`, beside its forward code, decides from
the intent and the disk whether it finishes or undoes it (the kinds are listed in
slm.ops.store.transaction_kinds); `slm fsck --repair` runs that step and ends the intent
(`end_interrupted`).

This is the only module that begins or ends an intent or raises CommittedIncomplete
(tests/unit/test_structure.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from slm.errors import CommittedIncomplete, SlmError
from slm.store.journal import Intent, Journal
from slm.store.reflog import Entry

if TYPE_CHECKING:
    from slm.store.store import StoreDir

# What counts as "a step after the commit point failed": an error the store reports, or Ctrl-C
# (the change is durable; saying "interrupted" would suggest it was not made). Anything else
# (a power cut simulated in-process, SystemExit) passes through unchanged.
_AFTER_COMMIT = (SlmError, KeyboardInterrupt)


class Transaction:
    """One transaction on the store (a context manager; open it with StoreDir.transaction)."""

    def __init__(self, journal: Journal, name: str, op: str, new: str, *, old: str | None = None,
                 created: bool = False, done: str = "", journaled: bool = True, undoable: bool = True):
        self.journal, self.name, self.op, self.new, self.old = journal, name, op, new, old
        self.created, self.done = created, done or f"the {op} is committed"
        self.journaled, self.undoable = journaled, undoable
        self.intent: Intent | None = None
        self.committed = False
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> "Transaction":
        if self.journaled:
            self.intent = self.journal.begin(self.name, self.op, self.old, self.new, self.created)
        return self

    def on_undo(self, step: Callable[[], None]) -> None:
        """Run `step` if the transaction fails before its commit point (steps run newest first,
        so register each one before the work it takes back)."""
        self._undo.append(step)

    def commit(self, action: Callable[[], object] | None = None,
               landed: Callable[[], bool] | None = None) -> None:
        """The commit point: `action()` makes the change durable. If it raises, `landed()` (when
        given) says whether the change is on disk all the same."""
        if not self.undoable:
            raise TypeError("a transaction without undo has no commit point")  # a caller's bug
        try:
            if action is not None:
                action()
        except BaseException:
            if landed is not None and _says_yes(landed):
                self.committed = True
            raise
        self.committed = True

    def __exit__(self, kind, err, tb) -> bool:
        if err is None:
            self._finish()
            return False
        if not self.undoable:
            return False  # the intent stays: fsck --repair clears it
        if not self.committed:
            self._take_back(err)
            return False
        if isinstance(err, _AFTER_COMMIT):
            raise self._incomplete(err) from err
        return False

    def _finish(self) -> None:
        """Clear the intent: the last step of a transaction that went through."""
        if self.intent is None:
            return
        if not self.undoable:
            self.journal.end(self.intent)
            return
        try:
            self.journal.end(self.intent)
        except _AFTER_COMMIT as err:
            raise self._incomplete(err) from err

    def _incomplete(self, err: BaseException) -> CommittedIncomplete:
        return CommittedIncomplete(f"{self.done}, but finishing it failed ({str(err) or 'interrupted'}); "
                                   "run `slm fsck --repair` to complete it")

    def _take_back(self, cause: BaseException) -> None:
        """Undo an uncommitted transaction and clear its intent. If the disk refuses, the intent
        stays and the error that ended the transaction says so."""
        try:
            for step in reversed(self._undo):
                step()
            if self.intent is not None:
                self.journal.end(self.intent)
        except (SlmError, OSError) as err:
            if isinstance(cause, SlmError):
                cause.message += f"; undoing it failed too ({err}): run `slm fsck --repair`"


def _says_yes(landed: Callable[[], bool]) -> bool:
    """landed() as asked after a failure: a check that itself fails answers no."""
    try:
        return bool(landed())
    except SlmError:
        return False


# -- after a crash: what `slm fsck --repair` does with an intent it finds --------------------

@dataclass(frozen=True)
class Seen:
    """What `slm fsck` established before it reads the journal, for a kind's `recover` to
    decide on: the committed transitions of refs/active (the reflog's intact lines, as rebuilt
    if it was damaged) and which blobs are intact (every one was re-hashed)."""
    transitions: list[Entry]
    intact: Callable[[str], bool]


@dataclass(frozen=True)
class Recovery:
    """A kind's decision on one of its interrupted transactions: what was interrupted, what
    `--repair` does about it, and the step that does it (finish or undo; None when clearing
    the intent is all there is to do)."""
    what: str
    action: str
    step: Callable[[], None] | None = None


Recover = Callable[["StoreDir", Intent, Seen], Recovery]


def end_interrupted(journal: Journal, intent: Intent | Path, step: Callable[[], None] | None = None) -> None:
    """`slm fsck --repair`'s end of an interrupted transaction: its kind's step, then the
    intent cleared as a transaction that went through clears it (a damaged record, given as
    its path, is removed whatever it is). A step that fails leaves the intent for another run."""
    if step is not None:
        step()
    journal.end(intent)
