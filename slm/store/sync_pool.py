"""A pool that writes and fsyncs new files (slm.store.fs.NewFile) on a few threads, for the
store's staging of many files at once (slm.store.objects). Every write and fsync is still
the fs layer's own: its fault points, its `_fsync`, its power-cut observer."""

from __future__ import annotations

import collections

from slm.store import fs


class Syncs:
    """New files written and fsynced on a few threads while the caller hashes the next ones.

    Why: an import stages one file per tensor (272 for SmolLM2), and one fsync after the
    other waited on the disk for each (most of an import's time); fsyncs of different files
    issued together share the disk's and the journal's work. The writes go with them: copying
    92 MB into the page cache took as long as hashing it, on the caller's thread. Each file is
    still written whole and fsynced once, by the same `_fsync`, and `wait()` is the barrier: it
    returns only when every write and fsync given to it has returned, and raises the first that
    failed (never retried, as everywhere). The caller names none of the files (links them into
    objects/) before `wait()` returned. The pool holds the bytes it was given until they are
    written; past IN_FLIGHT_BYTES of them the caller waits (an import that quantizes a checkpoint
    in memory keeps a bounded part of it, not all of it, when the disk is slower).

    The fault points of each write and fsync stay on the caller's thread, in order, so that the
    fault plans count operations as before. Under the power-cut simulator (`sync_observer` set)
    each runs at once on the caller's thread: its model of what is durable is kept by one thread."""

    THREADS = 8
    IN_FLIGHT_BYTES = 256 << 20

    def __init__(self) -> None:
        self._pool = None
        self._pending: list = []  # every job handed over since the last wait(), in order
        # the jobs that may still hold their bytes, oldest first, and those bytes: the front is
        # dropped once done (a job further on that is done early is counted until its turn:
        # the bound holds, a little early): a scan of every job at every file would be
        # quadratic in an import's files
        self._held: collections.deque = collections.deque()
        self._held_bytes = 0

    def write_sync_and_close(self, f: fs.NewFile, pieces: list) -> None:
        """Write `pieces` (bytes, memoryviews or fs.FileRange, in order) to f, then fsync and
        close it."""
        for _ in pieces:
            fs._fault_point("write", str(f.path))
        fs._fault_point("fsync", str(f.path))
        if fs.sync_observer is not None:
            for piece in pieces:
                f._write_now(piece)
            f._sync_and_close_now()
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=self.THREADS, thread_name_prefix="slm-fsync")
        # (a FileRange holds no memory of its own: the kernel copies it, or slm.store.fs_direct
        # through the one buffer of the thread that copies)
        size = sum(len(piece) for piece in pieces if not isinstance(piece, fs.FileRange))
        while self._held and (self._held[0][0].done() or self._held_bytes + size > self.IN_FLIGHT_BYTES):
            job, n = self._held.popleft()
            job.exception()  # waits for the oldest when over the bound (its failure: at wait())
            self._held_bytes -= n
        f._handed_off = True
        job = self._pool.submit(self._write_sync_and_close_now, f, pieces)
        self._pending.append(job)
        self._held.append((job, size))
        self._held_bytes += size

    @staticmethod
    def _write_sync_and_close_now(f: fs.NewFile, pieces: list) -> None:
        try:
            for piece in pieces:
                f._write_now(piece)
        except BaseException:
            f._close()
            raise
        f._sync_and_close_now()

    def _take_pending(self) -> list:
        """Every job handed over since the last call, in order; none is counted as held after."""
        pending, self._pending = self._pending, []
        self._held.clear()
        self._held_bytes = 0
        return pending

    def wait(self) -> None:
        """Every write and fsync handed over so far has returned; the first failure is raised."""
        failures = [job.exception() for job in self._take_pending()]  # waits for each
        first = next((err for err in failures if err is not None), None)
        if first is not None:
            raise first

    def close(self) -> None:
        """Wait for what is in flight (its failures no longer matter: the files are discarded)."""
        for job in self._take_pending():
            job.exception()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
