"""What a device that follows a registry tag runs from it, and why: `follow/state.json`.

    {"schema": "slm.follow/1", "reference": "host/repo:tag",
     "good":  {"composition", "manifest", "version"} or null      the last composition marked good
     "trial": {"composition", "manifest", "version",               the composition on trial, if any
               "previous": id or null,                              what was active before it
               "deaths": n,                                         follower starts that found it pending
               "failed": null or "why"}                             its verdict, once it failed
              or null,
     "bad":   [{"composition", "manifest", "version", "reason", "time"}, ...]}   never followed again

A trial in the state is a round in progress: it is recorded before the composition becomes
active, and leaves the state (marked good, or rolled back and marked bad) only when the round
is over. So after any crash, the active composition is the good one, the previous one, or the
trial named here: never a trial nobody knows of (slm.ops.ship.follow resumes or rolls it back).

Each change of the state is one store transaction of kind `follow`:

    journal/follow.intent (old and new digests of the state file) -> follow/state.json
    replaced (THE COMMIT POINT) -> intent cleared

and `recover` decides an interrupted one from the file on disk alone: it holds the new
state (committed: nothing more to do) or the old one (nothing happened).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from slm.distribution.bundle import is_sha256
from slm.distribution.reference import parse_reference
from slm.distribution.statement import MAX_VERSION
from slm.errors import IntegrityError, InvalidInput
from slm.formats.jsonfile import parse_json_object
from slm.store import StoreDir, fs
from slm.store import digest as dg
from slm.store.config import MAX_TRIAL_DEATHS
from slm.store.journal import Intent, intent_name
from slm.store.transaction import Recovery, Seen

KIND = "follow"  # journal/follow.intent: one follower per store
SCHEMA = "slm.follow/1"
FOLDER = "follow"
STATE_FILE = "state.json"
MAX_BAD = 256  # digests remembered as bad, newest kept
MAX_STATE_BYTES = 256 << 10
MAX_REASON = 300


@dataclass(frozen=True)
class Followed:
    """A composition the tag named: its id, the manifest digest it came as, its signed version."""
    composition: str
    manifest: str
    version: int


@dataclass(frozen=True)
class Trial(Followed):
    previous: str | None = None
    deaths: int = 0
    failed: str | None = None


@dataclass(frozen=True)
class Bad(Followed):
    reason: str = ""
    time: float = 0.0


@dataclass(frozen=True)
class FollowState:
    reference: str | None = None
    good: Followed | None = None
    trial: Trial | None = None
    bad: tuple[Bad, ...] = ()

    def is_bad(self, manifest: str, composition: str | None = None) -> Bad | None:
        return next((b for b in self.bad if b.manifest == manifest or b.composition == composition), None)

    def with_bad(self, followed: Followed, reason: str) -> "FollowState":
        entry = Bad(followed.composition, followed.manifest, followed.version, reason[:MAX_REASON],
                    round(time.time(), 3))
        kept = tuple(b for b in self.bad if b.manifest != followed.manifest)
        return dataclasses.replace(self, trial=None, bad=(kept + (entry,))[-MAX_BAD:])

    def to_bytes(self) -> bytes:
        doc = {"schema": SCHEMA, "reference": self.reference,
               "good": None if self.good is None else dataclasses.asdict(self.good),
               "trial": None if self.trial is None else dataclasses.asdict(self.trial),
               "bad": [dataclasses.asdict(b) for b in self.bad]}
        return json.dumps(doc, sort_keys=True, indent=1).encode("ascii") + b"\n"


def path(store: StoreDir) -> Path:
    return store.root / FOLDER / STATE_FILE


def read(store: StoreDir) -> FollowState:
    """The state on disk (an empty one if the store never followed a tag); IntegrityError if damaged."""
    data = fs.read_store_file(path(store), MAX_STATE_BYTES)
    return FollowState() if data is None else parse(data)


def parse(data: bytes) -> FollowState:
    where = f"{FOLDER}/{STATE_FILE}"
    try:
        doc = parse_json_object(data, where, MAX_STATE_BYTES, strict_keys=True)
        if doc.get("schema") != SCHEMA or set(doc) != {"schema", "reference", "good", "trial", "bad"}:
            raise InvalidInput(f"{where}: not an {SCHEMA} document")
        if doc["reference"] is not None and not is_tag_reference(doc["reference"]):
            raise InvalidInput(f"{where}: reference is not a registry tag")
        bad = doc["bad"]
        if not isinstance(bad, list) or len(bad) > MAX_BAD:
            raise InvalidInput(f"{where}: bad is not a list of at most {MAX_BAD}")
        return FollowState(doc["reference"], _record(doc["good"], Followed, where),
                           _record(doc["trial"], Trial, where), tuple(_record(b, Bad, where) for b in bad))
    except InvalidInput as err:
        raise IntegrityError(f"{err} (the follower's state is damaged: run `slm fsck`)") from err


def is_tag_reference(text) -> bool:
    """Whether `text` is a registry tag as a follower records it (host/repo:tag, normalised)."""
    try:
        ref = parse_reference(text) if isinstance(text, str) else None
    except InvalidInput:
        return False
    return ref is not None and ref.digest is None and str(dataclasses.replace(ref, tag=ref.ref)) == text


def _record(doc, cls, where: str):
    if doc is None and cls is not Bad:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(doc, dict) or set(doc) != names:
        raise InvalidInput(f"{where}: a {cls.__name__.lower()} record without exactly its fields")
    # each value within what the follower writes: a version a statement can carry, a count of
    # deaths that max_trial_deaths can reach, a finite time (a hand-edited state that freezes
    # the device at version 2**60 is damage, reported by fsck, not a state to run on)
    ok = (isinstance(doc["composition"], str) and dg.is_digest(doc["composition"]) and is_sha256(doc["manifest"])
          and type(doc["version"]) is int and 1 <= doc["version"] <= MAX_VERSION)
    if cls is Trial:
        ok = ok and (doc["previous"] is None or (isinstance(doc["previous"], str) and dg.is_digest(doc["previous"])))
        ok = ok and type(doc["deaths"]) is int and 0 <= doc["deaths"] <= MAX_TRIAL_DEATHS
        ok = ok and (doc["failed"] is None or isinstance(doc["failed"], str) and len(doc["failed"]) <= MAX_REASON)
    if cls is Bad:
        ok = ok and isinstance(doc["reason"], str) and len(doc["reason"]) <= MAX_REASON
        ok = ok and type(doc["time"]) in (int, float) and math.isfinite(doc["time"]) and doc["time"] >= 0
    if not ok:
        raise InvalidInput(f"{where}: a {cls.__name__.lower()} record with a malformed field")
    return cls(**doc)


def write(store: StoreDir, old: FollowState, new: FollowState, op: str) -> None:
    """Replace the state, as one transaction (under the store lock, which the caller may hold)."""
    data = new.to_bytes()
    new_digest = dg.of_bytes(data)
    with store.locked():
        current = fs.read_store_file(path(store), MAX_STATE_BYTES)
        if (parse(current) if current is not None else FollowState()) != old:
            raise IntegrityError("the follower's state changed under it (another follower?)")
        old_digest = None if current is None else dg.of_bytes(current)
        fs.mkdir(path(store).parent)
        with store.transaction(intent_name(KIND), op, new_digest, old=old_digest,
                               done="the follower's state is committed") as tx:
            tx.commit(lambda: fs.atomic_replace(path(store), data),
                      landed=lambda: _digest_on_disk(store) == new_digest)


def _digest_on_disk(store: StoreDir) -> str | None:
    data = fs.read_store_file(path(store), MAX_STATE_BYTES)
    return None if data is None else dg.of_bytes(data)


def recover(store: StoreDir, intent: Intent, seen: Seen) -> Recovery:
    """The state file holds the new state (committed) or the old one (not): either way it is
    whole (it is only ever renamed into place), so clearing the intent is all there is to do."""
    try:
        on_disk = _digest_on_disk(store)
    except IntegrityError:
        on_disk = None
    if on_disk == intent.new:
        return Recovery(f"interrupted follower step {intent.op}, committed", "clear its intent")
    return Recovery(f"interrupted follower step {intent.op}, not committed", "clear its intent (nothing changed)")
