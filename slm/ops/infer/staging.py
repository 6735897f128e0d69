"""The compositions staged in this process (validated, overlays built, one memory map per
base), and which one is current.

For a long-running process (a server, a notebook, a benchmark; slm.api.Runtime wraps it):
`switch(id)` makes another composition the current one (`self.active`), the one new work is
given. A composition staged before is switched to by swapping one reference (the seed's
in-memory "atomic swap of the active model handle"); a new one is staged first (validated,
blobs re-hashed, overlays built), sharing the base's memory map with any composition of that
base alive in the process (staged, or dropped from the table while work still runs on it).
Work already running keeps the Loaded it was given. This does not change refs/active: that is
`slm activate`'s job.
"""

from __future__ import annotations

import threading
import weakref

from slm.compose.composition import Composition
from slm.errors import InvalidInput
from slm.ops.infer import compositions
from slm.ops.infer.loading import Loaded, load_composition
from slm.store import StoreDir


class StagedCompositions:
    def __init__(self, store: StoreDir, max_staged: int = 8):
        if max_staged < 1:  # 0 would evict each composition as it is staged (the current one kept)
            raise InvalidInput(f"max_staged must be at least 1 (compositions kept staged), not {max_staged}")
        self.store = store
        self.max_staged = max_staged
        self.staged: dict[str, Loaded] = {}  # composition id -> loaded, least recently used first
        self.active: Loaded | None = None
        # staging from several threads (sessions opened concurrently) takes turns: the staged
        # table is read and trimmed as one step, and a composition is staged once
        self._lock = threading.RLock()
        # base digest -> every Loaded on that base still alive: staged, or evicted from the
        # table while work still runs on it. A composition staged later shares their tensors
        # (one memory map, one set of int8 copies: slm.model.packed_copies keys them by
        # tensor) and its rows their decode step (slm.engine.scheduler groups rows by tensors);
        # otherwise a base mapped again would be re-hashed, packed again beside the live copy,
        # and decoded in a step of its own
        self._live: dict[str, weakref.WeakValueDictionary] = {}  # base -> {id(loaded): loaded}

    def stage(self, comp: str | Composition) -> Loaded:
        """A composition by id (stored), or a Composition (stored or not: a server stages a
        spec it was asked for without activating it)."""
        with self._lock:
            return self._stage(comp)

    def _stage(self, comp: str | Composition) -> Loaded:
        comp_id = comp if isinstance(comp, str) else comp.id
        if comp_id in self.staged:
            self.staged[comp_id] = self.staged.pop(comp_id)  # now the most recently used
            return self.staged[comp_id]
        if isinstance(comp, str):
            comp = compositions.load(self.store, comp_id)
        # require_signed holds for what a server runs unactivated: load_composition enforces it
        shared = self._on_base(comp.base)
        # a base already staged in this process had its blobs re-hashed then
        loaded = load_composition(self.store, comp, verify=shared is None)
        if shared is not None:
            loaded.model.t = shared.model.t  # one memory map per base
        self._live.setdefault(comp.base, weakref.WeakValueDictionary())[id(loaded)] = loaded
        self.staged[comp_id] = loaded
        for old in list(self.staged)[: max(0, len(self.staged) - self.max_staged)]:
            if self.active is None or old != self.active.id:
                del self.staged[old]
        return loaded

    def _on_base(self, base: str) -> Loaded | None:
        """A Loaded on this base alive in this process (staged first), or None."""
        staged = next((l for l in self.staged.values() if l.composition.base == base), None)
        return staged or next(iter(self._live.get(base, {}).values()), None)

    def switch(self, comp_id: str) -> Loaded:
        with self._lock:
            loaded = self._stage(comp_id)
            self.active = loaded  # the swap: one reference assignment
            return loaded

    def compositions(self) -> list[Composition]:
        """The staged compositions, least recently used first (read as one step)."""
        with self._lock:
            return [loaded.composition for loaded in self.staged.values()]
