"""`slm fsck`'s check of the follower's state (follow/state.json: slm.ops.ship.follow_state),
called once interrupted transactions are dealt with:

    a damaged state file             -> reported; not repaired (the versions it recorded are
                                        the device's defence against a rollback: remove the
                                        file by hand to follow afresh)
    a trial pending, no follower     -> the follower died during a trial. Repaired as a
      holding the follow lock           round undone: the last good composition (else the one
                                        active before the trial) made active again and the
                                        trial marked bad (`slm follow --clear-bad` lets it be
                                        tried again). A follower that starts first resumes the
                                        trial itself (slm.ops.ship.follow.resume).

`add` is the checker's (slm.ops.store.fsck.Fsck.add).
"""

from __future__ import annotations

from typing import Callable

from slm.errors import SlmError
from slm.store import StoreDir
from slm.store import digest as dg

Add = Callable[..., None]


def check_follow(store: StoreDir, add: Add) -> None:
    from slm.ops.ship import follow, follow_state

    if not follow_state.path(store).parent.exists():
        return
    try:
        state = follow_state.read(store)
    except SlmError as err:
        add("follow-state", str(err), "remove follow/state.json by hand to follow afresh "
            "(the versions it recorded are forgotten)", repairable=False)
        return
    trial = state.trial
    if trial is None or follow.is_following(store):
        return
    add("follow-trial", f"the follower of {state.reference} died during the trial of version {trial.version} "
        f"({dg.short(trial.composition)}); no follower runs",
        "roll it back to the last good composition and mark it bad",
        lambda: follow.roll_back_interrupted(store))
