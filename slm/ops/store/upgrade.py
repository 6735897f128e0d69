"""`slm activate --upgrade [COMPOSITION]`: carry a composition over to this runtime.

A composition's identity names the runtime version that verified it, and validation refuses a
composition of another runtime (its numbers were checked with other code). After an upgrade
of slm, the same base + adapters + weights under the new runtime is a *new* composition: this
builds it, verifies it against the fresh-base oracle (integrity and numerics, as `slm verify`),
and only then makes it active, as the logged transition "upgrade". The old id stays in the
reflog and the store: listed, shown, logged; running or rolling back to it is refused with a
message that names this command.
"""

from __future__ import annotations

from slm.compose.composition import RUNTIME
from slm.errors import NotFound
from slm.ops.store import activation, specs
from slm.ops.infer import compositions, verify
from slm.ops.progress import NoProgress
from slm.ops.results import CompositionInfo, Transition
from slm.store import StoreDir


def upgrade(store: StoreDir, ref: str | None = None, memory_budget: str | None = None) -> Transition:
    with store.locked():
        _, active_id = activation.preflight(store)
        target = specs.resolve(store, ref).id if ref is not None else active_id
        if target is None:
            raise NotFound("nothing is active; name the composition to upgrade")
        new = compositions.load(store, target).for_runtime(RUNTIME)
        if new.id == active_id:
            return Transition(False, active_id, CompositionInfo.of(new),
                              note="already built for this runtime and active")
        report = verify.VerifyReport(new.id, new.base, CompositionInfo.of(new).adapters,
                                     verify.check_integrity(store, new, NoProgress()),
                                     verify.check_numerics(store, new))
        report.check()  # a composition that does not verify under this runtime is not switched to
        return activation.switch(store, new, "upgrade", memory_budget)
