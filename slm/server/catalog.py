"""The compositions a server runs: the active one, followed from refs/active, and any that
requests name, staged in one slm.api.Runtime (validated, re-hashed, one memory map per base).

Hot swap (docs/serve.md): a watcher thread reads refs/active every POLL_S; when it changes
it takes the id, stages that composition (the checks of `slm activate`: every blob
re-hashed, shapes, targets, finite weights, the memory budget) and switches `active` to it
by one reference assignment. A composition that fails is not switched to: the server keeps
the old one, logs why and reports it in /v1/slm/status. Requests take `active` when they are
admitted and keep that Loaded to their end. Nothing here writes to the store.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable

from slm import Composition, CompositionInfo, NotFound, SlmError
from slm.api import Runtime, short_digest, short_digest_pair

if TYPE_CHECKING:
    from slm.api import Loaded

POLL_S = 0.01  # how often refs/active is read (~80 bytes): a change is seen within ~10 ms


@dataclass(frozen=True)
class Switch:
    """One change of refs/active as the server saw it."""

    previous: str | None
    to: str
    ok: bool
    error: str | None
    noticed_ms: float  # from the ref file's modification time to the watcher seeing it
    staged_ms: float  # staging (validation) until the switch, or the refusal
    at: float  # time.time() of the switch or refusal


class Catalog:
    def __init__(self, runtime: Runtime, log: Callable[[str], None] = print):
        self.runtime = runtime  # stages one composition at a time, and within its memory budget
        self.store = runtime.store
        self.log = log
        self.active: Loaded | None = None
        self.active_error: str | None = None  # why what refs/active names is not served
        self.ref_names: str | None = None  # what refs/active named at the last look
        self.switches: list[Switch] = []
        self._ref_path = self.store.active_ref_path
        self._seen: bytes | None = None  # refs/active's bytes at the last look
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_switch: Callable[[Switch], None] | None = None

    # -- staging -----------------------------------------------------------------------------
    def stage(self, comp: Composition) -> Loaded:
        return self.runtime.stage(comp)

    def resolve(self, model: str | None) -> Loaded:
        """What a request's `model` names: None ("active") -> the active composition; a
        composition spec of any form (a tag, an id or prefix, BASE+ADAPTER@W..., @active~N, a
        pulled reference), staged and validated as `slm activate` does (the same one-line errors)."""
        if model is None:
            active = self.active
            if active is None:
                raise NotFound(self.active_error or "nothing is active: run `slm activate BASE [ADAPTER...]` "
                               "or name a composition in `model`")
            return active
        return self.stage(self.store.composition(model))  # the one spec grammar (slm.ops.store.specs)

    # -- following refs/active ---------------------------------------------------------------
    def start(self) -> None:
        """Stage what refs/active names now, then follow it on a thread."""
        self.poll(initial=True)
        self._thread = threading.Thread(target=self._watch, name="slm-refs-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.poll()
            except Exception as err:  # the watcher must outlive anything one look can raise
                self.log(f"refs/active watcher: {type(err).__name__}: {err}")

    def poll(self, initial: bool = False) -> Switch | None:
        """One look at refs/active; stages and switches when it names something new."""
        # The contents decide (an inode number can be reused and a timestamp be coarse); the
        # file's modification time only dates the change for the `noticed_ms` measurement.
        try:
            text = self._ref_path.read_bytes()
        except FileNotFoundError:
            text = None
        except OSError as err:
            text = f"unreadable: {err}".encode()
        if text == self._seen:
            return None
        noticed = time.time()
        try:
            mtime = os.stat(self._ref_path).st_mtime_ns / 1e9
        except OSError:
            mtime = noticed
        self._seen = text
        try:
            comp = self.store.active()
        except SlmError as err:
            return self._refuse(None, f"refs/active cannot be read: {err}", noticed, mtime)
        new_id = None if comp is None else comp.id
        self.ref_names = new_id
        current = None if self.active is None else self.active.id
        if new_id == current:
            self.active_error = None
            return None
        if comp is None:  # nothing active any more (a fresh store): keep serving what we have
            return None
        try:
            loaded = self.runtime.switch(comp)  # staged, and kept staged while it is active
        except SlmError as err:
            return self._refuse(new_id, str(err), noticed, mtime)
        self.active, self.active_error = loaded, None  # the swap: one reference assignment
        done = time.time()
        if initial:
            self.log(f"serving {short_digest(new_id)} ({describe(loaded)}), staged in {(done - noticed) * 1e3:.0f} ms")
            return None
        sw = Switch(current, new_id, True, None, round(max(0.0, noticed - mtime) * 1e3, 2),
                    round((done - noticed) * 1e3, 2), done)
        self._record(sw)
        self.log(f"switched to {short_digest(new_id)} ({describe(loaded)}): seen {sw.noticed_ms:.1f} ms after "
                 f"refs/active changed, staged in {sw.staged_ms:.0f} ms")
        return sw

    def _refuse(self, new_id: str | None, error: str, noticed: float, mtime: float) -> Switch:
        current = None if self.active is None else self.active.id
        new_short, current_short = short_digest_pair(new_id or "", current or "")
        self.active_error = f"refs/active names {new_short if new_id else 'something'} which is not " \
                            f"served: {error}"
        sw = Switch(current, new_id or "", False, error, round(max(0.0, noticed - mtime) * 1e3, 2),
                    round((time.time() - noticed) * 1e3, 2), time.time())
        self._record(sw)
        still = f"still serving {current_short}" if current else "nothing is served on 'active'"
        self.log(f"not switching: {self.active_error}; {still}")
        return sw

    def _record(self, sw: Switch) -> None:
        self.switches = [*self.switches[-99:], sw]
        if self.on_switch is not None:
            self.on_switch(sw)

    # -- status ------------------------------------------------------------------------------
    def status(self) -> dict:
        active = self.active
        est = self.runtime.memory_estimate(active) if active is not None else None
        last = self.switches[-1] if self.switches else None
        staged = [info.to_json() for info in self.runtime.staged()]
        return {
            "active": CompositionInfo.of(active.composition).to_json() if active is not None else None,
            "active_error": self.active_error,
            "refs_active": self.ref_names,
            "staged": staged,
            "memory_estimate": est,
            "memory_budget": self.runtime.memory_budget,
            "mode": self.runtime.mode,  # "int8" or "exact": every answer's numerics (docs/numerics.md)
            "switches": sum(1 for s in self.switches if s.ok),
            "last_switch": None if last is None else asdict(last),
        }


def describe(loaded: Loaded) -> str:
    comp = loaded.composition
    parts = [comp.base_name or short_digest(comp.base)] + [f"{a.name or short_digest(a.digest)}@{a.weight:g}"
                                                       for a in comp.adapters]
    return "+".join(parts)
