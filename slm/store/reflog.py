"""logs/active: one checksummed line per transition of refs/active, append-only; and
logs/names/<kind>/<name>: the same lines for each name (slm/store/names.py), where a
deletion (`slm rm`) is a line whose new digest is `-`.

    <seq> <old id or -> <new id or -> <unix time> <op> <check>\n
    (each a checked line: slm/store/checked_line.py)

Each line is appended and fsynced before refs/active changes. A last line without its
newline or with a bad check is a torn tail from a crash: readers ignore it and report it;
`slm fsck --repair` truncates it. A bad line anywhere else is corruption.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from slm.errors import IntegrityError, NeedsRecovery
from slm.store import checked_line
from slm.store import digest as dg
from slm.store import fs

NONE = "-"
MAX_REFLOG_BYTES = 256 << 20  # about a million transitions
_OP = re.compile(r"[a-z][a-z-]{0,31}")


@dataclass(frozen=True)
class Entry:
    seq: int
    old: str | None
    new: str | None  # None only in a name's log: the name was removed
    time: float
    op: str

    def body(self) -> str:
        return f"{self.seq} {self.old or NONE} {self.new or NONE} {self.time:.6f} {self.op}"


def encode(entry: Entry) -> bytes:
    return checked_line.encode(entry.body())


def parse_line(line: bytes, deletions: bool = False) -> Entry | None:
    """The entry on a line (with its newline), or None if the line is not intact
    (`deletions`: a name's log, where the new digest may be `-`)."""
    body = checked_line.decode(line)
    parts = [] if body is None else body.split(" ")
    if len(parts) != 5:
        return None
    seq, old, new, stamp, op = parts
    try:
        entry = Entry(int(seq), None if old == NONE else old, None if new == NONE else new, float(stamp), op)
    except ValueError:
        return None
    new_ok = dg.is_digest(entry.new) if entry.new is not None else deletions
    ok = new_ok and (entry.old is None or dg.is_digest(entry.old))
    return entry if ok and _OP.fullmatch(op) else None


@dataclass
class ReflogState:
    entries: list[Entry]
    torn_tail: bytes  # bytes after the last intact line (empty when clean)
    intact_size: int  # length of the intact prefix, for truncation


class Reflog:
    def __init__(self, path: Path, deletions: bool = False):
        self.path = path
        self.deletions = deletions  # a name's log: a line may record the name's removal

    def read(self) -> ReflogState:
        data = fs.read_store_file(self.path, MAX_REFLOG_BYTES)
        if data is None:
            return ReflogState([], b"", 0)
        entries: list[Entry] = []
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                break  # no newline: torn
            entry = parse_line(data[pos:end + 1], self.deletions)
            if entry is None or entry.seq != len(entries) + 1:
                if data.find(b"\n", end + 1) >= 0:
                    raise IntegrityError(
                        f"{self.path}: line {len(entries) + 1} is damaged (run `slm fsck`)"
                    )
                break  # the damaged line is the last one: a torn tail
            entries.append(entry)
            pos = end + 1
        return ReflogState(entries, data[pos:], pos)

    def salvage(self) -> list[Entry]:
        """What `slm fsck --repair` can rebuild from a reflog with damaged lines in the middle.

        Transitions chain (each line's old id is the previous line's new id), so a run of
        damaged lines between two intact ones is replaced by one line from the first's new id
        to the second's old id (op "repaired", the time of the line before it), or by nothing
        when the two already meet. Lines are renumbered; a damaged or torn tail is dropped.
        """
        data = fs.read_store_file(self.path, MAX_REFLOG_BYTES) or b""
        lines = data.split(b"\n")[:-1]  # the part after the last newline is a torn tail
        intact = [parse_line(raw + b"\n", self.deletions) for raw in lines]
        while intact and intact[-1] is None:
            intact.pop()
        out: list[Entry] = []
        gap = False
        for entry in intact:
            if entry is None:
                gap = True
                continue
            prev_new = out[-1].new if out else None
            if gap and entry.old is not None and entry.old != prev_new:
                stamp = out[-1].time if out else entry.time
                out.append(Entry(len(out) + 1, prev_new, entry.old, stamp, "repaired"))
            out.append(Entry(len(out) + 1, entry.old, entry.new, entry.time, entry.op))
            gap = False
        return out

    def rewrite(self, entries: list[Entry]) -> None:
        """Replace the whole reflog atomically: old or new after a crash, never a mix
        (`slm fsck --repair` rebuilding it, `slm gc` expiring its oldest entries)."""
        fs.atomic_replace(self.path, b"".join(encode(e) for e in entries))

    def entries(self) -> list[Entry]:
        return self.read().entries

    def append(self, old: str | None, new: str | None, op: str, state: ReflogState | None = None) -> Entry:
        state = state or self.read()
        if state.torn_tail:
            raise NeedsRecovery(f"{self.path} has a torn last line; run `slm fsck --repair`")
        entry = Entry(len(state.entries) + 1, old, new, time.time(), op)
        fs.point("reflog.before-append")
        fs.append_durably(self.path, encode(entry))
        fs.point("reflog.after-append")
        return entry
