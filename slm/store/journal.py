"""journal/: the intent of an in-flight transaction, written before it acts.

    journal/<kind>.intent or journal/<kind>-<key>.intent
        one checked line (slm/store/checked_line.py) whose body is
        "<op> <old id or -> <new id> <flags>"   or, as first written, "<op> <old id or -> <new id>"

    kind: which transaction this is, and so who finishes or undoes it after a crash (the
          kinds and their recovery: slm.ops.store.transaction_kinds); key: which one of that
          kind (an import's name, a received composition's id), so that two may be in flight.
    flags: "created" when the transaction itself creates the record that names <new>
           (a composition record, an import's name), so that undoing it removes that record
           and nothing a user made earlier; "-" otherwise.

Written (fsynced) before the transaction writes anything else, removed after. If one is
found, a transaction was interrupted: `slm fsck --repair` finishes it (its commit point is
durable) or undoes it (it is not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from slm.errors import IntegrityError, SlmError
from slm.store import checked_line
from slm.store import digest as dg
from slm.store import fs

NONE = "-"
MAX_INTENT_BYTES = 4096
_OP = re.compile(r"[a-z][a-z-]{0,31}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._%-]{0,250}")  # % : an encoded registry reference


def intent_name(kind: str, key: str = "") -> str:
    """The name of a transaction's intent: its kind, then the key that tells apart two of that
    kind in flight at once (none for a kind of which there is only ever one)."""
    return f"{kind}-{key}" if key else kind


@dataclass(frozen=True)
class Intent:
    name: str
    op: str
    old: str | None
    new: str
    created: bool = False  # the transaction creates the record naming `new`

    @property
    def kind(self) -> str:
        return self.name.partition("-")[0]

    @property
    def key(self) -> str:
        return self.name.partition("-")[2]


def parse_intent(name: str, data: bytes) -> Intent:
    """An intent record's fields, every one checked; IntegrityError if anything is off."""
    body = checked_line.decode(data)
    if body is None:
        raise IntegrityError(f"journal/{name}.intent is damaged (torn, not text, or a bad checksum)")
    fields = body.split(" ")
    if len(fields) not in (3, 4):
        raise IntegrityError(f"journal/{name}.intent is damaged (malformed)")
    op, old, new = fields[:3]
    flags = fields[3] if len(fields) == 4 else NONE
    ok = (_OP.fullmatch(op) is not None and dg.is_digest(new) and (old == NONE or dg.is_digest(old))
          and flags in (NONE, "created"))
    if not ok:
        raise IntegrityError(f"journal/{name}.intent is damaged (a bad field)")
    return Intent(name, op, None if old == NONE else old, new, flags == "created")


class Journal:
    def __init__(self, root: Path):
        self.root = root

    def begin(self, name: str, op: str, old: str | None, new: str, created: bool = False) -> Intent:
        body = f"{op} {old or NONE} {new} {'created' if created else NONE}"
        path = self.root / f"{name}.intent"
        fs.point("journal.before-intent")
        try:
            fs.atomic_replace(path, checked_line.encode(body))
        except BaseException:
            # the rename may have happened before the directory fsync failed: a transaction
            # that failed to begin leaves no intent behind (best effort; fsck clears the rest)
            try:
                fs.unlink(path)
            except SlmError:  # IOFailure: the first error is the one to report
                pass
            raise
        return Intent(name, op, old, new, created)

    def end(self, intent: Intent | Path) -> None:
        """Clear an intent, durably: the last step of a transaction, whether it went through or
        `slm fsck --repair` finished or undid it. A damaged record (its path, as `pending` gives
        it) is removed whatever stands there: a file, a FIFO, a directory."""
        fs.point("journal.before-clear")
        fs.remove_any(intent if isinstance(intent, Path) else self.root / f"{intent.name}.intent")

    def pending(self) -> list[Intent | Path]:
        """Intents on disk; a damaged one (or anything else named *.intent) as its path."""
        out: list[Intent | Path] = []
        for path in sorted(self.root.glob("*.intent")):
            try:
                if not _NAME.fullmatch(path.stem):
                    raise IntegrityError(f"journal/{path.name}: not an intent name")
                data = fs.read_store_file(path, MAX_INTENT_BYTES)
                if data is None:
                    continue  # removed since the listing
                out.append(parse_intent(path.stem, data))
            except IntegrityError:
                out.append(path)
        return out
