"""The prompt's second thread: NativeKernels' pool (slm.model.kernels_native), which a forked
child replaces with its own.

Why: a child forked after the pool started has none of its parent's threads; work handed to
the parent's pool would wait forever (docs/api.md, "Processes").
"""

from __future__ import annotations

import os
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

_LIVE: weakref.WeakSet = weakref.WeakSet()  # every pool of this process


class PrefillPool:
    """One worker thread (a ThreadPoolExecutor's), this process's own even after a fork."""

    def __init__(self) -> None:
        self._executor = self._new_executor()
        _LIVE.add(self)

    @staticmethod
    def _new_executor() -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="slm-prefill")

    def submit(self, fn, *args) -> Future:
        return self._executor.submit(fn, *args)

    def shutdown(self) -> None:
        self._executor.shutdown()

    def _restart_in_child(self) -> None:
        self._executor = self._new_executor()  # (the parent's, threadless here, is dropped)


def _restart_all_in_child() -> None:
    for pool in list(_LIVE):
        pool._restart_in_child()


os.register_at_fork(after_in_child=_restart_all_in_child)
