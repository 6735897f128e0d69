"""The scheduler: continuous batching of every admitted request, one decode step for all.

One engine thread owns the models. Between two steps it admits queued requests, runs one
chunk of one admitted prompt's prefill (slm.engine.generation.prefill_next, the chunks `slm run`
prefills: prompts take turns, a chunk each, so a long prompt delays the running requests by
one chunk per step, never by its whole prefill) and drops finished or cancelled ones; each step
runs the next token of every running request together (slm.engine.generation.decode over
slm.model.batch.decode_step: one kernel call per layer reads each quantized block once for all
rows, each row adding its own composition's overlays), rows grouped by base. A request keeps the
Loaded it was admitted with to its end, so it never sees a token of another composition; its KV
cache is its own, and the prompt cache is keyed by composition id.

Each request is a slm.engine.generation.Sequence, driven by the functions `slm run` drives for
its one sequence (the arithmetic, the sampler, the stop rules and stop sequences of
slm.engine.stops), so a greedy answer here is token for token the answer of `slm run` on the
same composition. This module's own job: the queue, admission, the prompts' turns,
cancellation, metrics and the requests' sinks.
Events go to the request's sink from this thread: ("text", piece, logprobs) (logprobs: the
slm.TokenLogprobs of the tokens since the last piece, empty unless the request asked), ("done",
reason, prompt_tokens, completion_tokens) or ("error", exception): an SlmError for what the
request caused, any other exception for a bug (the server maps both to HTTP in one place).

A request with n choices is n Jobs (prepare_choices), one per choice, each with its own seed
(slm.engine.sampling.choice_seeds), sequence and sink, submitted together (submit_all): rows of
the same batch. The prompt is prefilled once: choice 0 prefills it; the others wait (in
self.awaiting) and then copy its keys and values from the prompt cache (a prompt too large for
the cache, or a choice 0 that failed or was cancelled: they prefill their own).
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from slm.errors import Busy, InvalidInput, ShuttingDown, SlmError
from slm.model import modes
from slm.engine.generate import PREFILL_CHUNK
from slm.engine.generation import Sequence, decode, first_token, prefill_next
from slm.engine.prepare import Choice, Prepared, prepare
from slm.engine.prompt_cache import MemoryPromptCache
from slm.engine.request import GenerationRequest, ToolCall
from slm.engine.stops import CANCELLED
from slm.engine.structured import tool_answer
from slm.engine.target import Target
from slm.model.kernels import default_kernels
from slm.ops.results import TokenLogprobs

__all__ = ["Job", "Scheduler"]

@dataclass(eq=False)
class Job:
    """One choice of a prepared request, from submission to its close."""

    rid: str
    prepared: Prepared  # its target is pinned: the composition it runs on, start to finish
    choice: Choice
    sink: Callable[[tuple], None]
    admitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # the client went away (or the server stops): dropped before the next step
    finished: bool = False
    seq: Sequence | None = None  # its generation, from admission on
    first_token_s: float | None = None
    logprobs_sent: int = 0  # how many of seq.token_logprobs went out with text already
    twin: "Job | None" = None  # choice 0 of its request, whose prefill the others copy
    content: str | None = None  # with tools, once finished: the answer's text outside its calls
    content_rest: str | None = None  # ... and the part of it not sent as ("text", piece) events
    gate: object | None = None  # with tools (a ToolFormat's gate): what of the answer streams before its calls
    tool_calls: tuple[ToolCall, ...] = ()  # with tools, once finished: the calls read from the answer

    @property
    def req(self) -> GenerationRequest:
        return self.prepared.request

    @property
    def loaded(self) -> Target:
        return self.prepared.target

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.prepared.prompt_ids

    @property
    def index(self) -> int:
        return self.choice.index

    @property
    def seed(self) -> int:
        return self.choice.seed

    def take_logprobs(self) -> list[TokenLogprobs]:
        """The logprobs of the tokens not yet handed out (with a text piece, or now)."""
        if self.seq is None or self.seq.logprobs is None:
            return []
        from slm.ops.infer.run import logprob_view

        new = self.seq.token_logprobs[self.logprobs_sent:]
        self.logprobs_sent += len(new)
        return [logprob_view(self.loaded.tokenizer, record) for record in new]

    @property
    def ids(self) -> list[int]:
        return self.seq.ids if self.seq is not None else []

    def cancel(self) -> None:
        self.cancelled = True  # read by the engine thread before each step


class Scheduler:
    def __init__(self, max_batch: int = 8, max_queue: int = 32, threads: int | None = None,
                 memory_budget: int | None = None, metrics=None, log: Callable[[str], None] = print,
                 activations: str = "float32", prefill_chunk: int = PREFILL_CHUNK):
        self.max_batch, self.max_queue, self.threads = max_batch, max_queue, threads
        self.prefill_chunk = prefill_chunk
        self.activations = activations  # the batch step's and every request's model's (alike, so
        # that a batched answer is its request's answer alone)
        self.budget, self.metrics, self.log = memory_budget, metrics, log
        self.pending: queue.Queue[Job] = queue.Queue()
        self.running: list[Job] = []
        self.prefilling: collections.deque[Job] = collections.deque()  # admitted, prompt not yet all in the cache
        self.awaiting: list[Job] = []  # admitted choices waiting for their choice 0's prefill (its copy)
        # Prompts are tokenized (and large bodies parsed) on this one thread: off the event loop
        # and the engine thread; one thread's allocator arena holds at most one prompt's peak
        # (each thread that tokenized a long prompt kept its own, slm.model.allocator); and the
        # event loop competes for the GIL with this thread alone
        self.preparing = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="slm-prepare")
        self.prompts = MemoryPromptCache()
        self.draining = False
        self.inflight = 0  # submitted and not yet closed: queued, being prefilled or running
        self._count_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._loop, name="slm-engine", daemon=True)
        self.kernels = None

    # -- called from the server's threads ------------------------------------------------------
    def prepare(self, loaded: Target, req: GenerationRequest, sink: Callable[[tuple], None]) -> Job:
        """Tokenize and check a one-choice request against its composition's model (InvalidInput
        if it cannot run, BudgetExceeded over the memory budget)."""
        if req.n != 1:
            raise InvalidInput(f"n is {req.n}: a request with several choices goes through prepare_choices")
        return self.prepare_choices(loaded, req, lambda index: sink)[0]

    def prepare_choices(self, loaded: Target, req: GenerationRequest,
                        sink_of: Callable[[int], Callable[[tuple], None]]) -> list[Job]:
        """prepare for each of the request's n choices: choice i's events go to sink_of(i)
        (InvalidInput if n is over max_batch: a request's choices are rows of one batch)."""
        prepared = prepare(loaded, req, mode=modes.of_activations(self.activations), memory_budget=self.budget,
                           max_n=self.max_batch)
        rid = f"{'chatcmpl' if req.chat else 'cmpl'}-{next(self._ids)}"
        jobs = [Job(rid, prepared, choice, sink_of(choice.index)) for choice in prepared.choices]
        for job in jobs[1:]:
            job.twin = jobs[0]
        return jobs

    def submit(self, job: Job) -> None:
        self.submit_all([job])

    def submit_all(self, jobs: list[Job]) -> None:
        """Queue a request's jobs (its choices) together, or none (Busy, ShuttingDown)."""
        if self.draining:
            raise ShuttingDown("the server is shutting down")
        with self._count_lock:
            if self.inflight + len(jobs) > self.max_batch + self.max_queue:
                raise Busy(f"the server is full ({self.max_batch} running, {self.max_queue} waiting); "
                           "retry shortly")
            self.inflight += len(jobs)  # each until its _close
        for job in jobs:
            self.pending.put(job)
        self._gauge()
        self._wake.set()

    def start(self) -> None:
        self._thread.start()

    def drain(self) -> None:
        """Admit nothing new; what is queued or running goes on."""
        self.draining = True

    def request_stop(self) -> None:
        """Cancel everything: the engine thread ends what it runs (a decode step or one prefill
        chunk), then closes every request as cancelled and ends. Returns at once."""
        self.draining = True
        self._stop.set()
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel everything and end the thread."""
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.preparing.shutdown(wait=False, cancel_futures=True)

    def busy(self) -> int:
        return self.inflight

    # -- the engine thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        self.kernels = default_kernels()  # the batch step's kernels, owned by this thread
        if self.threads is not None:
            self.kernels.set_threads(self.threads)  # OpenMP threads are set per calling thread
        self.kernels.set_activations(self.activations)
        while not self._stop.is_set():
            self._admit()
            if not self.running and not self.prefilling and not self.awaiting:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            self._prefill_next()  # one chunk of one prompt, between two decode steps
            self._resume_awaiting()
            if not self.running or self._stop.is_set():
                continue
            try:
                self._step()
            except Exception as err:  # a bug: fail the running requests, keep serving
                self.log(f"engine step failed: {type(err).__name__}: {err}")
                for job in self.running:
                    self._fail(job, err)
                self.running = []
        for job in [*self.running, *self.prefilling, *self.awaiting, *self._drain_pending()]:
            if self._close(job):
                job.sink(("done", CANCELLED, len(job.prompt_ids), len(job.ids)))
        self.running, self.awaiting = [], []
        self.prefilling.clear()

    def _drain_pending(self) -> list[Job]:
        out = []
        while True:
            try:
                out.append(self.pending.get_nowait())
            except queue.Empty:
                return out

    def _admit(self) -> None:
        while len(self.running) + len(self.prefilling) + len(self.awaiting) < self.max_batch:
            try:
                job = self.pending.get_nowait()
            except queue.Empty:
                break
            if job.cancelled:
                self._dropped(job)
                continue
            self._guarded(job, self._start, job)
        self.running = [j for j in self.running if not self._dropped(j)]
        self._gauge()

    def _guarded(self, job: Job, work: Callable, *args) -> None:
        """Run one job's prefill work; its failure fails that job only."""
        try:
            work(*args)
        except SlmError as err:
            self._fail(job, err)
        except Exception as err:  # a bug: fail this request, keep the engine thread alive
            self.log(f"engine prefill failed: {type(err).__name__}: {err}")
            self._fail(job, err)

    def _start(self, job: Job) -> None:
        """A job's sequence (sampler, cache, stop rules streaming to its sink); a prompt in the
        prompt cache runs at once, any other waits its turns in self.prefilling."""
        loaded = job.loaded
        send = lambda piece: job.sink(("text", piece, job.take_logprobs()))  # noqa: E731
        job.gate = job.prepared.tool_gate(send)  # (with tools: prose streams, calls wait to be read whole)
        job.seq = job.prepared.sequence(job.choice, on_text=send if job.gate is None else job.gate.push)
        logits = self.prompts.get(loaded.id, job.prompt_ids, job.seq.cache)
        if logits is None and self._twin_prefilling(job):
            self.awaiting.append(job)
        elif logits is None:
            self.prefilling.append(job)
        else:
            self._first_token(job, logits)

    def _twin_prefilling(self, job: Job) -> bool:
        return job.twin is not None and not job.twin.finished and job.twin in self.prefilling

    def _resume_awaiting(self) -> None:
        """Choices whose choice 0 has prefilled the prompt copy its keys and values from the
        prompt cache and run (or, not found there, prefill their own)."""
        waiting = []
        for job in self.awaiting:
            if self._dropped(job):
                continue
            if self._twin_prefilling(job):
                waiting.append(job)
                continue
            self._guarded(job, self._resume, job)
        self.awaiting = waiting

    def _resume(self, job: Job) -> None:
        logits = self.prompts.get(job.loaded.id, job.prompt_ids, job.seq.cache)
        if logits is None:
            self.prefilling.append(job)
        else:
            self._first_token(job, logits)

    def _prefill_next(self) -> None:
        """One chunk of the first waiting prompt, which then goes to the back of the line (the
        prompts take turns), or, its prompt complete, samples its first token and runs. It stays
        in self.prefilling meanwhile (what /v1/slm/status counts)."""
        while self.prefilling and self._dropped(self.prefilling[0]):
            self.prefilling.popleft()  # cancelled, or failed in its last chunk
        if not self.prefilling:
            return
        self._guarded(self.prefilling[0], self._advance, self.prefilling[0])
        self._gauge()

    def _advance(self, job: Job) -> None:
        model = job.loaded.model
        if self.threads is not None:
            model.kernels.set_threads(self.threads)
        model.kernels.set_activations(self.activations)
        started = time.perf_counter()
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            logits = prefill_next(job.seq, self.prefill_chunk)
        if self.metrics:
            self.metrics.prefill_seconds.observe(time.perf_counter() - started)
        if logits is None:
            self.prefilling.rotate(-1)  # to the back: the next prompt's turn
            return
        self.prefilling.popleft()
        self.prompts.put(job.loaded.id, job.prompt_ids, job.seq.cache, logits)
        self._first_token(job, logits)

    def _first_token(self, job: Job, logits: np.ndarray) -> None:
        first_token(job.seq, logits)
        job.first_token_s = time.perf_counter() - job.admitted
        if self.metrics:
            self.metrics.first_token.observe(job.first_token_s)
        if job.seq.done:
            self._finish(job)
        else:
            self.running.append(job)

    def _step(self) -> None:
        groups: dict[int, list[Job]] = {}
        for job in self.running:
            groups.setdefault(id(job.loaded.model.t), []).append(job)  # rows of one base share a step
        for jobs in groups.values():
            if self.metrics:  # what shares this one step: its rows, and the compositions they run on
                self.metrics.batch_rows.observe(len(jobs))
                self.metrics.step_compositions.observe(len({job.loaded.id for job in jobs}))
            started = time.perf_counter()
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                errors = decode([j.seq for j in jobs], self.kernels)
            if self.metrics:
                self.metrics.step_seconds.observe(time.perf_counter() - started)
            for job, error in zip(jobs, errors):
                if error is not None:
                    self._fail(job, error)
                elif job.seq.done:
                    self._finish(job)  # dropped below
        self.running = [j for j in self.running if not self._dropped(j)]

    def _dropped(self, job: Job) -> bool:
        if job.cancelled and self._close(job):
            self._count_cancelled()
        return job.finished

    def _close(self, job: Job) -> bool:
        """The one exit of a job (finished, failed or cancelled); False if it was closed before."""
        if job.finished:
            return False
        job.finished = True
        with self._count_lock:
            self.inflight -= 1
        return True

    def _finish(self, job: Job) -> None:
        if job.gate is not None:
            job.content, job.tool_calls = tool_answer(job.loaded, job.seq.stops.text)
            job.content_rest = job.gate.rest(job.content)
        self._close(job)
        job.sink(("done", job.seq.reason, len(job.prompt_ids), len(job.ids)))
        if self.metrics:
            self.metrics.tokens.labels("prompt").inc(len(job.prompt_ids))
            self.metrics.tokens.labels("completion").inc(len(job.ids))

    def _fail(self, job: Job, err: Exception) -> None:
        self._close(job)
        job.sink(("error", err))

    def _count_cancelled(self) -> None:
        if self.metrics:
            self.metrics.cancelled.inc()

    def _gauge(self) -> None:
        if self.metrics:
            self.metrics.queue_depth.set(self.pending.qsize())
            self.metrics.running.set(len(self.running) + len(self.prefilling) + len(self.awaiting))
