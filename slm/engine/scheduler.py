"""The scheduler: continuous batching of every admitted request, one decode step for all.

`submit(target, request)` prepares a request (slm.engine.prepare, on the scheduler's one
preparing thread) and queues it; what it returns, a slm.engine.handle.Handle, gives the
request's typed events and cancels it. `status()` is a typed snapshot.

One engine thread owns the models. Between two steps it admits queued requests, runs one
chunk of one admitted prompt's prefill (slm.engine.generation.prefill_next, the chunks `slm run`
prefills: prompts take turns, a chunk each, so a long prompt delays the running requests by
one chunk per step, never by its whole prefill) and drops finished or cancelled ones; each step
runs the next token of every running request together (slm.engine.generation.decode over
slm.model.batch.decode_step: one kernel call per layer reads each quantized block once for all
rows, each row adding its own composition's overlays), rows grouped by base. A request keeps the
Target it was prepared on to its end, so it never sees a token of another composition; its KV
cache is its own, and the prompt cache is keyed by composition id.

Each request is a slm.engine.generation.Sequence, prepared and driven as `slm run` prepares
and drives its one sequence (slm.engine.prepare; the arithmetic, the sampler, the stop rules
and stop sequences of slm.engine.stops), so a greedy answer here is token for token the answer
of `slm run` on the same composition. This module's own job: the queue, admission, the prompts'
turns, cancellation, metrics and the events.

A request with n choices is n Jobs (slm.engine.job), one per choice, each with its own seed
(slm.engine.sampling.choice_seeds) and sequence, queued together: rows of the same batch. The
prompt is prefilled once: choice 0 prefills it; the others wait (in self.awaiting) and then
copy its keys and values from the prompt cache (a prompt too large for the cache, or a choice 0
that failed or was cancelled: they prefill their own).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import queue
import threading
import time
from typing import Callable

import numpy as np

from slm.engine.generate import PREFILL_CHUNK
from slm.engine.generation import decode, first_token, prefill_next
from slm.engine.handle import FailedEvent, Handle, SchedulerStatus
from slm.engine.job import Job, LogprobView
from slm.engine.prepare import Prepared, encode, prepare, prompt_ids, render
from slm.engine.prompt_cache import MemoryPromptCache
from slm.engine.request import GenerationRequest
from slm.engine.stops import CANCELLED
from slm.engine.target import Target
from slm.errors import Busy, InvalidInput, ShuttingDown, SlmError
from slm.model import modes
from slm.model.chat import ChatPrompt
from slm.model.kernels import default_kernels

__all__ = ["Scheduler"]


class Scheduler:
    """max_batch rows decode together, max_queue more wait (then Busy); threads, memory budget
    (bytes) and activations ("float32" or "int8", slm.model.modes) are every request's;
    view(tokenizer, record) makes what a logprob event carries of each record."""

    def __init__(self, max_batch: int = 8, max_queue: int = 32, threads: int | None = None,
                 memory_budget: int | None = None, metrics=None, log: Callable[[str], None] = print,
                 activations: str = "float32", prefill_chunk: int = PREFILL_CHUNK,
                 view: LogprobView = lambda tokenizer, record, special: record):
        self.max_batch, self.max_queue, self.threads = max_batch, max_queue, threads
        self.prefill_chunk = prefill_chunk
        self.activations = activations  # the batch step's and every request's model's (alike, so
        # that a batched answer is its request's answer alone)
        self.budget, self.metrics, self.log, self.view = memory_budget, metrics, log, view
        self.pending: queue.Queue[Job] = queue.Queue()
        self.running: list[Job] = []
        self.prefilling: collections.deque[Job] = collections.deque()  # admitted, prompt not yet all in the cache
        self.awaiting: list[Job] = []  # admitted choices waiting for their choice 0's prefill (its copy)
        # Prompts are tokenized (and large bodies parsed) on this one thread: off the event loop
        # and the engine thread; one thread's allocator arena holds at most one prompt's peak
        # (each thread that tokenized a long prompt kept its own, slm.model.allocator); and the
        # event loop competes for the GIL with this thread alone
        self._preparing = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="slm-prepare")
        self._preparing_jobs = 0  # given to that thread, not yet done (bounded: _prepare)
        self.prompts = MemoryPromptCache()
        self.draining = False  # a plain attribute: /health reads it without waiting on anything
        self.inflight = 0  # submitted and not yet closed: queued, being prefilled or running
        self._inflight_names: collections.Counter[str] = collections.Counter()  # those, by Handle.name
        self._count_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._loop, name="slm-engine", daemon=True)
        self.kernels = None

    # -- called from the readers' threads --------------------------------------------------------
    def submit(self, target: Target, request: GenerationRequest, stream: bool = True,
               name: str | None = None) -> Handle:
        """Prepare a request on the preparing thread and queue its choices together, or none
        (InvalidInput if it cannot run there, n over max_batch included; BudgetExceeded; Busy
        when full; ShuttingDown once draining). stream: text events as it decodes; else each
        choice's text comes whole with its DoneEvent. name: what the request called its
        composition (status() counts rows by it; default: the composition id)."""
        self._check_submission(target, request)
        rendered = render(target, request)  # (a chat's template: on this thread, not the preparing one)
        return self._prepare(self._submit, target, request, stream, rendered, name).result()

    async def submit_async(self, target: Target, request: GenerationRequest, stream: bool = True,
                           name: str | None = None) -> Handle:
        """submit, awaited on an event loop that keeps serving meanwhile (a chat's template
        rendered on a pool thread of the loop's, each request on its own)."""
        self._check_submission(target, request)
        rendered = await asyncio.get_running_loop().run_in_executor(None, render, target, request) \
            if request.chat else None
        return await asyncio.wrap_future(self._prepare(self._submit, target, request, stream, rendered,
                                                                name))

    def _check_submission(self, target: Target, request: GenerationRequest) -> None:
        """What submit takes, checked before any thread is asked: a GenerationRequest on a Target
        (InvalidInput), while the scheduler admits requests (ShuttingDown once drained or stopped)."""
        if not isinstance(request, GenerationRequest):
            raise InvalidInput(f"submit takes a GenerationRequest, not {type(request).__name__}")
        if not isinstance(target, Target):
            raise InvalidInput(f"submit runs a request on a staged composition (Runtime.stage), not {type(target).__name__}")
        if self.draining:
            raise ShuttingDown("the server is shutting down")

    async def prompt_ids(self, target: Target, request: GenerationRequest) -> list[int]:
        """The token ids `submit` would run `request` on, awaited, nothing queued: its chat
        rendered as submit_async renders it, tokenized on the preparing thread
        (slm.engine.prepare.prompt_ids; InvalidInput for a prompt that is empty or fills the
        context)."""
        return await self._rendered_then(prompt_ids, "prompt_ids", target, request)

    async def check(self, target: Target, request: GenerationRequest) -> Prepared:
        """What `submit` would run `request` on, checked as submit checks it (InvalidInput,
        BudgetExceeded: the context, the vocabulary, the schema, n, the memory budget) and
        prepared, nothing queued: the prompt's ids and the request with its max_tokens resolved."""
        return await self._rendered_then(self._checked, "check", target, request)

    async def _rendered_then(self, work: Callable, what: str, target: Target, request: GenerationRequest):
        """work(target, request, rendered) on the preparing thread, awaited, a chat's template
        rendered first on a pool thread of the loop's (as submit_async renders it)."""
        if not isinstance(request, GenerationRequest) or not isinstance(target, Target):
            raise InvalidInput(f"{what} takes a GenerationRequest on a staged composition (Runtime.stage)")
        rendered = await asyncio.get_running_loop().run_in_executor(None, render, target, request) \
            if request.chat else None
        return await asyncio.wrap_future(self._prepare(work, target, request, rendered))

    async def tokenize(self, target: Target, text: str, add_special: bool = True) -> list[int]:
        """A text's token ids on the preparing thread, awaited (slm.engine.prepare.encode: no
        check against the context)."""
        if not isinstance(target, Target) or not isinstance(text, str):
            raise InvalidInput("tokenize takes a text on a staged composition (Runtime.stage)")
        return await asyncio.wrap_future(self._prepare(encode, target, text, add_special))

    async def call_preparing(self, work: Callable, *args):
        """Run work(*args) on the preparing thread (a large body's parsing, /tokenize), awaited."""
        return await asyncio.wrap_future(self._prepare(work, *args))

    def _prepare(self, work: Callable, *args) -> concurrent.futures.Future:
        """work(*args) given to the preparing thread; Busy when max_batch + max_queue jobs are
        there already. Every request's text waits its turn on that one thread, and a tokenizer
        endpoint's text is as long as a body may be: unbounded, a flood of them would hold their
        texts in memory and delay every generation's prompt behind them without end."""
        with self._count_lock:
            if self._preparing_jobs >= self.max_batch + self.max_queue:
                raise Busy(f"the server is full ({self._preparing_jobs} requests waiting to be prepared); "
                           "retry shortly")
            self._preparing_jobs += 1
        try:
            future = self._preparing.submit(work, *args)
        except BaseException:  # (the thread stopped: shutting down)
            self._job_done(None)
            raise
        future.add_done_callback(self._job_done)  # (a cancelled job's too)
        return future

    def _job_done(self, _future) -> None:
        with self._count_lock:
            self._preparing_jobs -= 1

    def _checked(self, target: Target, request: GenerationRequest, rendered: ChatPrompt | None) -> Prepared:
        return prepare(target, request, mode=modes.of_activations(self.activations), memory_budget=self.budget,
                       max_n=self.max_batch, rendered=rendered)

    def _submit(self, target: Target, request: GenerationRequest, stream: bool,
                 rendered: ChatPrompt | None, name: str | None) -> Handle:
        prepared = self._checked(target, request, rendered)
        jobs: list[Job] = []
        handle = Handle(f"{'chatcmpl' if request.chat else 'cmpl'}-{next(self._ids)}", target.id,
                        len(prepared.prompt_ids), tuple(c.seed for c in prepared.choices),
                        cancel=lambda: [job.cancel() for job in jobs], name=name)
        jobs += [Job(handle, prepared, choice, stream, self.view) for choice in prepared.choices]
        for job in jobs[1:]:
            job.twin = jobs[0]
        self._queue(jobs)
        return handle

    def _queue(self, jobs: list[Job]) -> None:
        if self.draining:
            raise ShuttingDown("the server is shutting down")
        with self._count_lock:
            if self.inflight + len(jobs) > self.max_batch + self.max_queue:
                raise Busy(f"the server is full ({self.max_batch} running, {self.max_queue} waiting); "
                           "retry shortly")
            self.inflight += len(jobs)  # each until its _close
            self._inflight_names[jobs[0].handle.name] += len(jobs)
            for job in jobs:  # (under the lock: status() sees them counted and queued, or neither)
                self.pending.put(job)
        self._gauge()
        self._wake.set()

    def status(self) -> SchedulerStatus:
        """Read from any thread while the engine thread runs. The rows by name are one snapshot
        (queued ones, and those in flight, under the locks that change them: a row moving from
        the queue to the batch is counted once); running, prefilling and the KV positions are
        read from the engine's lists as they are (each copied in one step: a list or deque
        copied from C holds the GIL throughout), so a row may be counted in the state it just left."""
        with self._count_lock, self.pending.mutex:
            waiting = collections.Counter(job.handle.name for job in self.pending.queue)
            admitted = self._inflight_names - waiting
        running, prefilling, awaiting = list(self.running), list(self.prefilling), list(self.awaiting)
        rows = [*running, *prefilling, *awaiting]
        return SchedulerStatus(queued=sum(waiting.values()), running=len(running),
                               prefilling=len(prefilling) + len(awaiting),  # (choices awaiting a copy)
                               max_batch=self.max_batch, draining=self.draining,
                               admitted_by_name=dict(admitted), waiting_by_name=dict(waiting),
                               kv_positions=sum(job.seq.cache.length for job in rows if job.seq is not None),
                               kv_capacity=self.max_batch * max((job.target.model.cfg.context_length
                                                                 for job in rows), default=0))

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
        self._preparing.shutdown(wait=False, cancel_futures=True)

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
                job.handle.deliver(job.done(CANCELLED))
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
        """A job's sequence (sampler, cache, stop rules streaming to its Handle); a prompt in the
        prompt cache runs at once, any other waits its turns in self.prefilling."""
        seq = job.start()
        logits = self.prompts.get(job.target.id, job.prompt_ids, seq.cache)
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
        logits = self.prompts.get(job.target.id, job.prompt_ids, job.seq.cache)
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
        model = job.target.model
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
        self.prompts.put(job.target.id, job.prompt_ids, job.seq.cache, logits)
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
            groups.setdefault(id(job.target.model.t), []).append(job)  # rows of one base share a step
        for jobs in groups.values():
            if self.metrics:  # what shares this one step: its rows, and the compositions they run on
                self.metrics.batch_rows.observe(len(jobs))
                self.metrics.step_compositions.observe(len({job.target.id for job in jobs}))
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
            job.handle.deliver(job.done(CANCELLED))  # (whoever still reads learns why it ended)
        return job.finished

    def _close(self, job: Job) -> bool:
        """The one exit of a job (finished, failed or cancelled); False if it was closed before."""
        if job.finished:
            return False
        job.finished = True
        with self._count_lock:
            self.inflight -= 1
            self._inflight_names[job.handle.name] -= 1
            if not self._inflight_names[job.handle.name]:
                del self._inflight_names[job.handle.name]
        return True

    def _finish(self, job: Job) -> None:
        self._close(job)
        job.handle.deliver(job.done(job.seq.reason))
        if self.metrics:
            self.metrics.tokens.labels("prompt").inc(len(job.prompt_ids))
            self.metrics.tokens.labels("completion").inc(len(job.ids))

    def _fail(self, job: Job, err: Exception) -> None:
        self._close(job)
        job.handle.deliver(FailedEvent(job.choice.index, err))

    def _count_cancelled(self) -> None:
        if self.metrics:
            self.metrics.cancelled.inc()

    def _gauge(self) -> None:
        if self.metrics:
            self.metrics.queue_depth.set(self.pending.qsize())
            self.metrics.running.set(len(self.running) + len(self.prefilling) + len(self.awaiting))
