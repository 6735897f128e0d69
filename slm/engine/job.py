"""One choice of a submitted request inside the scheduler (slm.engine.scheduler): its prepared
sequence, its place in the queue and the batch, and the events it hands to its Handle."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from slm.engine.generation import Sequence
from slm.engine.handle import DoneEvent, Handle, TextEvent
from slm.engine.prepare import Choice, Prepared
from slm.engine.structured import tool_answer
from slm.engine.target import Target

# A logprob record (slm.engine.generation.TokenLogprob) as the reader wants it, given the
# target's tokenizer and whether special tokens' texts are the answer's (the request's
# skip_special_tokens false): slm.api makes the public slm.TokenLogprobs of it
LogprobView = Callable[[object, object, bool], object]


@dataclass(eq=False)
class Job:
    handle: Handle
    prepared: Prepared  # its target is pinned: the composition it runs on, start to finish
    choice: Choice
    stream: bool  # text events as it decodes; else its text comes whole with its DoneEvent
    view: LogprobView
    admitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # the reader went away (or the scheduler stops): dropped before the next step
    finished: bool = False
    seq: Sequence | None = None  # its generation, from admission on
    first_token_s: float | None = None
    logprobs_sent: int = 0  # how many of seq.token_logprobs went out already
    twin: "Job | None" = None  # choice 0 of its request, whose prefill the others copy
    gate: object | None = None  # with tools (a ToolFormat's gate): what of the answer streams before its calls
    sent: bool = False  # a TextEvent went out

    @property
    def target(self) -> Target:
        return self.prepared.target

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.prepared.prompt_ids

    @property
    def ids(self) -> list[int]:
        return self.seq.ids if self.seq is not None else []

    def cancel(self) -> None:
        self.cancelled = True  # read by the engine thread before each step

    def start(self) -> Sequence:
        """Its sequence: the text goes to the Handle as it settles (streamed) or stays in the
        stop rules until the end; with tools, through the gate that holds back calls."""
        self.gate = self.prepared.tool_gate(self._send) if self.stream else None
        send = self._send if self.gate is None else self.gate.push
        self.seq = self.prepared.sequence(self.choice, on_text=send if self.stream else None)
        return self.seq

    def _send(self, piece: str) -> None:
        self.handle.deliver(TextEvent(self.choice.index, piece, self.take_logprobs()))

    def take_logprobs(self) -> tuple:
        """The logprobs of the tokens not yet handed out."""
        if self.seq is None or self.seq.logprobs is None:
            return ()
        new = self.seq.token_logprobs[self.logprobs_sent:]
        self.logprobs_sent += len(new)
        special = not self.prepared.request.skip_special_tokens
        return tuple(self.view(self.target.tokenizer, record, special) for record in new)

    def done(self, reason: str) -> DoneEvent:
        """Its last event: the text not streamed (with tools: outside the calls) and the calls."""
        text = self.seq.stops.text if self.seq is not None else ""
        tools = self.prepared.request.tools
        content, calls = (None if self.stream else text), ()
        if tools is not None and tools.parsed and self.seq is not None:
            content, calls = tool_answer(self.target, text)
            if self.gate is not None:
                content = self.gate.rest(content)
        return DoneEvent(self.choice.index, reason, len(self.prompt_ids), len(self.ids), content, calls,
                         self.take_logprobs())
