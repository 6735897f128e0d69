"""Every kind of journaled store transaction, by the first word of its intent's name
(slm.store.journal.intent_name), with the function that finishes or undoes an interrupted one.

Each `recover` lives beside its kind's forward code and reads only the intent, the disk and
what fsck saw (slm.store.transaction.Seen). `slm fsck` dispatches on this table alone: an
intent of a kind that is not in it is reported, never guessed at. `slm sign` and the recording
of a certificate (slm.ops.ship.signing.list_blob) are not here: they journal nothing (a crash
leaves only blobs no name reaches, for `slm gc`).
"""

from __future__ import annotations

from slm.ops.ship import follow_state, receive
from slm.ops.store import activation, gc, importing, naming
from slm.store.transaction import Recover

RECOVER: dict[str, Recover] = {
    activation.KIND: activation.recover,  # active: activate, deactivate, rollback
    importing.KIND: importing.recover,    # import-<base|adapter>-<name>
    naming.KIND: naming.recover,          # name-<kind>-<name>: tag, rm, mv, a pull's reference
    receive.KIND: receive.recover,        # bundle-<composition hex>: import bundle, pull
    gc.KIND: gc.recover,                  # gc
    follow_state.KIND: follow_state.recover,  # follow: a change of the follower's state
}
