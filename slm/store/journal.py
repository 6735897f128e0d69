"""journal/: the intent of an in-flight transaction, written before it acts.

    journal/<name>.intent   one line: "<op> <old id or -> <new id> <check>\n"

Written (fsynced) before the reflog line and the ref swap, removed after. If one is found,
a transaction was interrupted: `slm fsck --repair` finishes or undoes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slm.store import digest as dg
from slm.store import fs

NONE = "-"


@dataclass(frozen=True)
class Intent:
    name: str
    op: str
    old: str | None
    new: str


def _check(body: str) -> str:
    return dg.of_bytes(body.encode("ascii"))[len(dg.PREFIX):][:16]


class Journal:
    def __init__(self, root: Path):
        self.root = root

    def begin(self, name: str, op: str, old: str | None, new: str) -> Intent:
        body = f"{op} {old or NONE} {new}"
        fs.point("journal.before-intent")
        fs.atomic_replace(self.root / f"{name}.intent", f"{body} {_check(body)}\n".encode("ascii"))
        return Intent(name, op, old, new)

    def end(self, intent: Intent) -> None:
        fs.point("journal.before-clear")
        fs.unlink(self.root / f"{intent.name}.intent")
        fs.fsync_dir(self.root)

    def pending(self) -> list[Intent | Path]:
        """Intents on disk; a damaged one is returned as its path."""
        out: list[Intent | Path] = []
        for path in sorted(self.root.glob("*.intent")):
            try:
                op, old, new, check = path.read_text("ascii").rstrip("\n").split(" ")
                assert check == _check(f"{op} {old} {new}") and dg.is_digest(new)
                out.append(Intent(path.stem, op, None if old == NONE else old, new))
            except (ValueError, AssertionError, UnicodeDecodeError):
                out.append(path)
        return out
