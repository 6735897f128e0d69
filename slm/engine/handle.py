"""What a submitted request gives back: a Handle, whose typed events say what each of its
choices produced (TextEvent, DoneEvent, FailedEvent), read from a thread (Handle.events) or
from an event loop (Handle.next_event), and whose cancel() ends it; and SchedulerStatus, the
scheduler's snapshot.

The scheduler's thread delivers the events; a Handle hands them on in order, without a wake-up
of the reader's event loop per token for a request that is not streamed (its text comes whole
in the DoneEvent).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Union

from slm.engine.request import ToolCall


@dataclass(frozen=True)
class TextEvent:
    """A piece of choice `choice`'s answer (a streamed request), with the logprobs of its
    tokens (when the request asked for them)."""

    choice: int
    piece: str
    logprobs: tuple = ()


@dataclass(frozen=True)
class DoneEvent:
    """Choice `choice` ended (slm.engine.stops' reason; "cancelled" when the request was cut
    by cancel() or the scheduler's stop). content: the answer's text not sent as TextEvents (a
    request not streamed: all of it; with tools, the text outside the calls, None if there is
    none); logprobs: those not sent yet."""

    choice: int
    reason: str
    prompt_tokens: int
    completion_tokens: int
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple = ()


@dataclass(frozen=True)
class FailedEvent:
    """Choice `choice` failed: an SlmError for what the request caused, any other exception
    for a bug (the server maps both to HTTP in one place)."""

    choice: int
    error: Exception


Event = Union[TextEvent, DoneEvent, FailedEvent]


@dataclass(frozen=True)
class SchedulerStatus:
    """A snapshot of the scheduler, counted in rows (a request's choices are a row each):
    requests waiting, running (decoding), prefilling (or waiting to copy their first choice's
    prefill), how many run together at most, whether it admits new ones; the admitted rows
    (running or prefilling) and the waiting ones by the name their requests gave their
    composition (Handle.name), read as one snapshot; the positions the admitted rows' KV
    caches hold, and how many max_batch rows of the longest context among their bases could
    hold (0 when none runs)."""

    queued: int
    running: int
    prefilling: int
    max_batch: int
    draining: bool
    admitted_by_name: Mapping[str, int] = field(default_factory=dict)
    waiting_by_name: Mapping[str, int] = field(default_factory=dict)
    kv_positions: int = 0
    kv_capacity: int = 0

    @property
    def admitted_rows(self) -> int:
        """The rows admitted (running or prefilling), from the same snapshot as `queued`."""
        return sum(self.admitted_by_name.values())

    @property
    def kv_usage(self) -> float:
        """kv_positions over kv_capacity: 0 when nothing runs, 1 when every row fills its context."""
        return self.kv_positions / self.kv_capacity if self.kv_capacity else 0.0


class Handle:
    """One submitted request: `id`, the composition it runs on, the name its submitter gave
    that composition (the composition id when it gave none), its prompt's length, each
    choice's seed; its events until every choice has ended."""

    def __init__(self, rid: str, composition: str, prompt_tokens: int, seeds: tuple[int, ...],
                 cancel: Callable[[], None], name: str | None = None):
        self.id, self.composition, self.prompt_tokens, self.seeds = rid, composition, prompt_tokens, seeds
        self.name = name or composition
        self._cancel = cancel
        self._open = len(seeds)  # choices not ended yet (as the reader sees them)
        self._lock = threading.Lock()
        self._pending: queue.SimpleQueue = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async: asyncio.Queue | None = None

    @property
    def finished(self) -> bool:
        """Every choice's last event was read."""
        return self._open == 0

    def cancel(self) -> None:
        """End every choice at its next token boundary (a no-op for those already ended)."""
        self._cancel()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """The events in order, blocking between them, until every choice has ended
        (TimeoutError when none comes within `timeout` seconds)."""
        while not self.finished:
            try:
                yield self._read(self._pending.get(timeout=timeout))
            except queue.Empty:
                raise TimeoutError(f"no event of request {self.id} within {timeout} s") from None

    async def next_event(self) -> Event:
        """The next event, awaited on the running event loop (the first call binds the Handle
        to it). Call only while not finished."""
        with self._lock:
            if self._async is None:
                self._loop, self._async = asyncio.get_running_loop(), asyncio.Queue()
                while not self._pending.empty():
                    self._async.put_nowait(self._pending.get_nowait())
        return self._read(await self._async.get())

    def deliver(self, event: Event) -> None:
        """The scheduler's thread hands over an event."""
        with self._lock:
            if self._async is None:
                self._pending.put(event)
                return
        try:
            self._loop.call_soon_threadsafe(self._async.put_nowait, event)
        except RuntimeError:  # the event loop is closed (shutdown): nobody is listening
            pass

    def _read(self, event: Event) -> Event:
        if not isinstance(event, TextEvent):
            self._open -= 1
        return event
