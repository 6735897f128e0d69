"""The follower's life: `slm follow REF` (and `slm serve --follow REF`) runs rounds
(slm.ops.ship.follow) until stopped, and reports each in cache/follow-status.json.

    start     the follow lock taken (a second follower is refused, exit 7); a store an earlier
              life left mid-transaction repaired as `slm fsck --repair` does; a trial left by a
              follower that died is resumed or rolled back (follow.resume): that is the first
              round; a trial an error interrupted later is resumed the same way, with no death
    round     follow.follow_round; a refusal or an error (registry down, slow, lying) is the
              round's outcome, never the follower's end: the device keeps what it runs
    wait      the interval (config.toml [follow] interval, or --interval), with a tenth of
              jitter so a fleet does not ask the registry at one instant; after failures in a
              row, twice as long each time, at most eight intervals

The status file is advisory, like the verified-digest cache: written in place without fsync,
read with bounds, ignored when damaged. What the device runs and why is the store's state
(follow/state.json, journaled); the status says only when the follower last asked and what
it heard.
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Callable

from slm.errors import ExitCode, SlmError
from slm.formats.jsonfile import parse_json_object
from slm.ops.results import FollowRound, FollowStatus
from slm.ops.ship import follow, follow_state
from slm.ops.infer.health import check_timeout
from slm.ops.infer.health_scripts import DEFAULT_TIMEOUT_S
from slm.store import StoreDir, fs
from slm.store.config import follow_interval_s, follow_settings

STATUS_FILE = "follow-status.json"  # in cache/
MAX_STATUS_BYTES = 16 << 10
MAX_LINE = 500  # characters of a text of the report
MAX_BACKOFF = 8  # intervals
JITTER = 0.1

OnRound = Callable[[FollowRound | None, SlmError | None], None]


def interval_of(store: StoreDir, interval: str | None) -> float:
    """--interval (a duration: 30s, 5m, 1h; a bare number is seconds), else config.toml's."""
    if interval is None:
        return follow_settings(store.config)["interval_s"]
    return follow_interval_s(interval, "--interval")


def delay_after(interval_s: float, failures: int) -> float:
    """Seconds until the next round: the interval, doubled per failure in a row up to
    MAX_BACKOFF intervals, with JITTER of it either way."""
    factor = 1 if failures == 0 else min(2 ** (failures - 1), MAX_BACKOFF)
    return interval_s * factor * random.uniform(1 - JITTER, 1 + JITTER)


def run(store: StoreDir, reference: str, *, insecure: bool = False, interval: str | None = None,
        once: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S, on_round: OnRound | None = None,
        stop: threading.Event | None = None, on_start: Callable[[], None] | None = None) -> FollowRound | None:
    """Follow `reference`. `once`: one round, returned (its refusal raised as its typed error).
    Otherwise rounds until `stop` is set, each reported to `on_round` (result or error); returns None.
    `on_start` is called once the follow lock is held, before the first round: what refuses to
    start (a bad REF or interval, another follower, a damaged state) is raised before it."""
    # what the operator got wrong is refused before the lock and before any round: a bad REF,
    # another tag than the store follows, a deadline the trial's checks would refuse only once
    # the trial is active, no key to believe a statement under
    interval_s = interval_of(store, interval)
    check_timeout(timeout_s)
    followed = str(follow.target(reference, follow_state.read(store)))
    follow.trusted_keys(store)
    stop = stop or threading.Event()
    failures, first = 0, True
    with follow.follower(store):
        if on_start is not None:
            on_start()
        while True:
            result, error = None, None
            try:
                died = first  # a trial pending at the start: this follower's last life ended in it
                if first:
                    _recover_if_interrupted(store)
                    first = False
                result = follow.resume(store, reference, died=died, timeout_s=timeout_s)
                if result is None:
                    result = follow.follow_round(store, reference, insecure=insecure, timeout_s=timeout_s)
            except SlmError as err:
                error = err
            failures = 0 if error is None else failures + 1  # a refusal or an error: the registry's
            wait = delay_after(interval_s, failures)
            _report(store, followed, result, error, failures, None if once else time.time() + wait)
            if once:
                if error is not None:
                    raise error
                return result
            if on_round is not None:
                on_round(result, error)
            if stop.wait(wait):
                return None


def _recover_if_interrupted(store: StoreDir) -> None:
    """A follower runs unattended: a transaction its last life left interrupted (kill -9 in an
    activation, a power cut in a pull) is finished or undone as `slm fsck --repair` would, before
    anything else. Under the follow lock, fsck leaves a pending trial to the follower's resume."""
    from slm.errors import NeedsRecovery
    from slm.ops.store import activation, fsck

    try:
        with store.locked():
            activation.preflight(store)
    except NeedsRecovery:
        fsck.fsck(store, repair=True)


def _report(store: StoreDir, reference: str, result: FollowRound | None, error: SlmError | None,
            failures: int, next_try: float | None) -> None:
    doc = {"reference": reference, "last_check": _stamp(time.time()),
           "last_outcome": result.outcome if result is not None else "error",
           "last_error": None if error is None else _line(str(error)),
           "last_exit_code": int(error.code) if error is not None else (0 if result.ok else int(ExitCode.UNHEALTHY)),
           "next_try": None if next_try is None else _stamp(next_try), "failures": failures}
    if result is not None and not result.ok:
        doc["last_error"] = _line(result.message)
    try:
        fs.write_advisory(store.root / "cache" / STATUS_FILE, json.dumps(doc, sort_keys=True).encode("ascii"))
    except SlmError:
        pass  # advisory: a status that cannot be written fails no round


def forget(store: StoreDir) -> None:
    """`slm follow --forget` (follow.forget), and the last round's report with it: a report of
    a tag no longer followed is not shown for a store that follows none."""
    follow.forget(store)
    try:
        fs.unlink(store.root / "cache" / STATUS_FILE)
    except SlmError:
        pass  # advisory: a report is only ever shown, never acted on


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _last_report(store: StoreDir) -> dict:
    """The last round's report; {} when there is none or it is damaged (it is advisory)."""
    try:
        data = fs.read_store_file(store.root / "cache" / STATUS_FILE, MAX_STATUS_BYTES)
        return parse_json_object(data, STATUS_FILE, MAX_STATUS_BYTES) if data else {}
    except SlmError:
        return {}


def _line(value) -> str | None:
    """A text of the status as one line (a report or a state written by someone else cannot add
    lines of its own to `slm follow --status`), None if it is not a text."""
    return " ".join(value.split())[:MAX_LINE] if isinstance(value, str) else None


def status(store: StoreDir) -> FollowStatus:
    """The follower's state in the store and its last report."""
    import dataclasses

    state = follow_state.read(store)
    report = _last_report(store)
    reference = state.reference
    if reference is None and follow_state.is_tag_reference(report.get("reference")):
        reference = report["reference"]  # a follower whose rounds have all been refused so far
    elif report.get("reference") != reference:
        report = {}  # a report of another tag (or of a state since forgotten)

    def text(key: str) -> str | None:
        return _line(report.get(key))

    code = report.get("last_exit_code")
    failures = report.get("failures")
    trial = None if state.trial is None else dataclasses.asdict(state.trial)
    if trial is not None:
        trial["failed"] = _line(trial["failed"])
    return FollowStatus(
        reference, follow.is_following(store), store.active_ref.read(),
        None if state.good is None else dataclasses.asdict(state.good), trial,
        [{**dataclasses.asdict(b), "reason": _line(b.reason)} for b in state.bad],
        text("last_check"), text("last_outcome"), text("last_error"),
        code if type(code) is int else None, text("next_try"), failures if type(failures) is int else 0)
