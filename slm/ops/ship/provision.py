"""`slm serve --model REF`: a registry reference made the store's active composition, ready to serve.

    the memory budget parsed (a bad one refused before the registry is asked)
    -> REF pinned by a digest the store already received under REF: that composition, no
       network at all
       else `slm pull REF` (a tag is resolved again: its manifest and small config fetched;
       only the blobs the store lacks are downloaded)
    -> `slm activate`'s transaction on it (the signing policy, every blob re-hashed, the
       memory budget; nothing written when it is active already)

So a replica that restarts on the store it pulled into starts without the registry when REF
names a digest, and follows a moved tag when REF names a tag. Every replica that pulls the same
reference activates the same composition id (an id is the hash of what a composition is, not
of where or when it was received), which is what its responses carry (`system_fingerprint`,
the `slm-composition` header).
"""

from __future__ import annotations

from slm.distribution.reference import parse_reference
from slm.ops.infer import budget, compositions
from slm.ops.progress import Progress
from slm.ops.results import Provisioned
from slm.ops.ship import registry_ops
from slm.ops.store import activation
from slm.store import StoreDir


def provision(store: StoreDir, reference: str, insecure: bool = False, memory_budget: str | None = None,
              progress: Progress | None = None) -> Provisioned:
    ref = parse_reference(reference)
    budget.resolve(store, memory_budget)
    known = store.names.get("remotes", str(ref)) if ref.digest is not None else None
    received = None
    if known is None:
        received = registry_ops.pull(store, reference, insecure, progress)
        known = received.composition_id
    transition = activation.switch(store, compositions.load(store, known), "activate", memory_budget)
    return Provisioned(str(ref), known, received, transition)
