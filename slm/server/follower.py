"""`slm serve --follow REF`: the server follows a registry tag (docs/fleet.md) on a thread of
its own, through Store.follow like any embedder.

The follower only changes the store (a trial activated, marked good, rolled back); the
catalog's refs/active watcher sees each activation and hot-swaps as it does for `slm activate`
from another process, and a request keeps the composition it was admitted on to its end.

Stopping (SIGTERM): the loop's stop event is set at once, so no round starts after it. A round
in progress is given the server's grace period (the drain waits for it as for a running
request); one still running then is abandoned with the process, as a kill would end it: every
step of a round is journaled, and the follower's next start resumes a trial it left
(counting that start as a death of the trial, docs/fleet.md).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

from slm import SlmError
from slm.server.metrics import refusal_name

if TYPE_CHECKING:
    from slm import FollowRound
    from slm.api import Store
    from slm.server.metrics import Metrics


class Follower:
    def __init__(self, store: Store, reference: str, *, insecure: bool, interval: str | None, metrics: Metrics,
                 log: Callable[[str], None]):
        self.store, self.reference, self.insecure, self.interval = store, reference, insecure, interval
        self.metrics, self.log = metrics, log
        self.stop_event = threading.Event()
        self._started = threading.Event()
        self._refused: Exception | None = None  # what ended the loop before it started
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run the loop on its thread; return once it holds the store's follow lock, or raise what
        refused it (a bad REF or interval 4, another follower 7, a damaged follower state 5)."""
        self._thread = threading.Thread(target=self._run, name="slm-follower", daemon=True)
        self._thread.start()
        while not self._started.wait(0.05):
            if not self._thread.is_alive():
                break
        if self._refused is not None:
            raise self._refused
        self.metrics.follow_status(self.store.follow_status, self.running)

    def stop(self) -> None:
        """No round starts after this; the one in progress goes on (see the module's note)."""
        self.stop_event.set()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            self.store.follow(self.reference, insecure=self.insecure, interval=self.interval,
                              on_round=self._on_round, stop=self.stop_event, on_start=self._started.set)
        except Exception as err:
            if not self._started.is_set():
                self._refused = err  # raised by start(), in the server's thread
            else:  # the server keeps serving what it has (slm_follow_running 0 tells it)
                why = str(err) if isinstance(err, SlmError) else f"{type(err).__name__}: {err}"
                self.log(f"follow {self.reference}: the follower stopped: {why}")

    def _on_round(self, result: FollowRound | None, error: SlmError | None) -> None:
        self.metrics.record_follow_round(result, error)
        if result is not None:
            self.log(f"follow {self.reference}: {result.outcome}: {result.message}")
        else:
            self.log(f"follow {self.reference}: {refusal_name(error.code)} (exit {int(error.code)}): {error}")
