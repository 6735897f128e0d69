"""journal/: the intent of an in-flight transaction, written before it acts.

    journal/<name>.intent   one line: "<op> <old id or -> <new id> <check>\n"
                        or  "<op> <old id or -> <new id> <flags> <check>\n"

    flags: "created" when the transaction itself creates the record that names <new>
           (a composition record, an import's name), so that undoing it removes that record
           and nothing a user made earlier; "-" otherwise. Four-field intents have no flags.
    check = first 16 hex of BLAKE3 of everything before it on the line

Written (fsynced) before the transaction writes anything else, removed after. If one is
found, a transaction was interrupted: `slm fsck --repair` finishes it (its reflog line is
durable) or undoes it (it is not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from slm.errors import IntegrityError, SlmError
from slm.store import digest as dg
from slm.store import fs

NONE = "-"
MAX_INTENT_BYTES = 4096
_OP = re.compile(r"[a-z][a-z-]{0,31}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._%-]{0,250}")  # % : an encoded registry reference


@dataclass(frozen=True)
class Intent:
    name: str
    op: str
    old: str | None
    new: str
    created: bool = False  # the transaction creates the record naming `new`


def _check(body: str) -> str:
    return dg.of_bytes(body.encode("ascii"))[len(dg.PREFIX):][:16]


def parse_intent(name: str, data: bytes) -> Intent:
    """An intent record's fields, every one checked; IntegrityError if anything is off."""
    try:
        fields = data.decode("ascii").split(" ")
    except UnicodeDecodeError as err:
        raise IntegrityError(f"journal/{name}.intent is not ASCII text") from err
    if not data.endswith(b"\n") or len(fields) not in (4, 5):
        raise IntegrityError(f"journal/{name}.intent is damaged (torn or malformed)")
    *body, check = fields
    check = check.rstrip("\n")
    op, old, new = body[:3]
    flags = body[3] if len(body) == 4 else NONE
    ok = (check == _check(" ".join(body)) and _OP.fullmatch(op) is not None
          and dg.is_digest(new) and (old == NONE or dg.is_digest(old)) and flags in (NONE, "created"))
    if not ok:
        raise IntegrityError(f"journal/{name}.intent is damaged (bad checksum or field)")
    return Intent(name, op, None if old == NONE else old, new, flags == "created")


class Journal:
    def __init__(self, root: Path):
        self.root = root

    def begin(self, name: str, op: str, old: str | None, new: str, created: bool = False) -> Intent:
        body = f"{op} {old or NONE} {new} {'created' if created else NONE}"
        path = self.root / f"{name}.intent"
        fs.point("journal.before-intent")
        try:
            fs.atomic_replace(path, f"{body} {_check(body)}\n".encode("ascii"))
        except BaseException:
            # the rename may have happened before the directory fsync failed: a transaction
            # that failed to begin leaves no intent behind (best effort; fsck clears the rest)
            try:
                fs.unlink(path)
            except SlmError:  # IOFailure: the first error is the one to report
                pass
            raise
        return Intent(name, op, old, new, created)

    def end(self, intent: Intent) -> None:
        fs.point("journal.before-clear")
        fs.unlink(self.root / f"{intent.name}.intent")
        fs.fsync_dir(self.root)

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
