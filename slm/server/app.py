"""The HTTP face of the server (Starlette on uvicorn): handlers translate HTTP <-> the catalog
and the scheduler, nothing more.

Every response carries an `slm-composition` header: the composition a generation ran on,
else the one active in the server. Errors are {"error": {"message": one line, ...}} with a
4xx status for anything the client sent wrong. The Guard (pure ASGI, so streaming passes
through untouched) checks the API key and the body size before a handler runs and logs one
line per request when its response is complete.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from slm import SlmError
from slm.api import FailedEvent, Handle, TextEvent
from slm.server import discovery, protocol, responses, tokens
from slm.server.catalog import Catalog
from slm.server.metrics import CONTENT_TYPE_LATEST, Metrics
from slm.server.protocol import BadRequest

if TYPE_CHECKING:
    from slm.api import Scheduler

DEFAULT_BODY_LIMIT = 1 << 20  # 1 MiB: a long prompt fits many times over
DISCARD_LIMIT = 64 << 20  # an oversized body up to this is read and dropped before the 413
HEADER = "slm-composition"
MODE_HEADER = "slm-mode"  # the runtime's numerics mode, "int8" or "exact", on every response
SEED_HEADER = "x-slm-seed"  # each choice's sampler seed, comma-separated in choice order
PARSE_INLINE_BYTES = 64 << 10  # bodies up to this are parsed on the event loop (well under a millisecond)
# A body's deadline: BODY_TIMEOUT_S, plus a second for each BODY_MIN_RATE bytes received (the
# registry client's rule for what it downloads). A client that stops sending half-way would
# otherwise hold its connection and its request open for ever.
BODY_TIMEOUT_S = 10.0
BODY_MIN_RATE = 16384


def body_time_left(started: float, received: int) -> float:
    """Seconds left for the rest of a body begun at `started` (time.monotonic()) of which
    `received` bytes came (0 once the deadline is past)."""
    return max(started + BODY_TIMEOUT_S + received / BODY_MIN_RATE - time.monotonic(), 0.0)

def error_response(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                   headers: dict | None = None, comp: str | None = None) -> JSONResponse:
    h = {HEADER: comp or "", **(headers or {})}
    return JSONResponse(responses.error_body(message, kind, code), status_code=status, headers=h)


class Guard:
    """API key (every path but the OPEN_PATHS), body size (by Content-Length; handlers also count what
    they read), the composition header default, the mode header, metrics and the one log line
    per request."""

    def __init__(self, app, api_key: str | None, body_limit: int, active_id: Callable[[], str | None],
                 metrics: Metrics, log: Callable[[str], None], mode: str):
        self.app, self.api_key, self.body_limit = app, api_key, body_limit
        self.active_id, self.metrics, self.log = active_id, metrics, log
        self.mode = mode

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        path, method = scope["path"], scope["method"]
        seen = {"status": 0}
        scope.setdefault("state", {})

        received = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        without_key = self._unauthenticated(received)
        unauthenticated = None if path in OPEN_PATHS else without_key
        # the active composition is told to a client with the key only, on the open paths too
        keyed = without_key is None
        refusal = unauthenticated if unauthenticated is not None else self._too_large(dict(received))

        async def send_tagged(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                headers = list(message.get("headers", []))
                if keyed and not any(k.lower() == HEADER.encode() and v for k, v in headers):
                    headers = [(k, v) for k, v in headers if k.lower() != HEADER.encode()]
                    headers.append((HEADER.encode(), (self.active_id() or "").encode()))
                headers.append((MODE_HEADER.encode(), self.mode.encode()))
                message = {**message, "headers": headers}
            await send(message)

        if refusal is not None:
            if refusal.status_code == 413:
                await self._discard_body(receive)
            await refusal(scope, receive, send_tagged)
        else:
            await self.app(scope, receive, send_tagged)
        elapsed = time.perf_counter() - started
        endpoint = path if path in KNOWN_PATHS else "other"
        self.metrics.requests.labels(endpoint, str(seen["status"])).inc()
        self.metrics.latency.labels(endpoint).observe(elapsed)
        note = scope["state"].get("log", "")
        self.log(f"{method} {path} {seen['status']} {elapsed:.3f}s{' ' + note if note else ''}")

    async def _discard_body(self, receive) -> None:
        """Read (and drop) an oversized body, up to DISCARD_LIMIT, so that the client, still
        sending, gets the 413 instead of a reset connection; within the body's deadline (one that
        stops arriving gets the 413 then)."""
        drained, started = 0, time.monotonic()
        while drained <= DISCARD_LIMIT:
            try:
                message = await asyncio.wait_for(receive(), body_time_left(started, drained))
            except asyncio.TimeoutError:
                return
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    def _unauthenticated(self, headers: list[tuple[str, str]]) -> Response | None:
        """The 401 of a request without the API key (one Authorization header, Bearer KEY)."""
        if self.api_key is None:
            return None
        auths = [v for k, v in headers if k == "authorization"]
        if not auths or not auths[0]:
            return error_response(401, "this server needs an API key: send Authorization: Bearer KEY",
                                  "authentication_error", "missing_api_key")
        if len(auths) > 1:  # which one a proxy or a framework reads differs: none is taken
            return error_response(401, "send one Authorization header, not several", "authentication_error",
                                  "invalid_api_key")
        scheme, _, key = auths[0].partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.api_key.encode()):
            return error_response(401, "wrong API key", "authentication_error", "invalid_api_key")
        return None

    def _too_large(self, headers: dict[str, str]) -> Response | None:
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return error_response(400, "Content-Length is not a number")
            if int(length) > self.body_limit:
                return error_response(413, f"the request body is {int(length)} bytes; the limit is "
                                      f"{self.body_limit}", code="body_too_large")
        return None


# Answered without the API key: what routers and orchestrators poll, which carry no key and learn
# nothing of a request's content there (a state, a count of rows in flight).
OPEN_PATHS = frozenset({"/health", "/get_load"})
KNOWN_PATHS = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/v1/slm/status", "/metrics",
               "/tokenize", "/detokenize", "/v1/completions/render", "/v1/chat/completions/render", "/get_load"}


class ClientGone(Exception):
    """The client of a request that is not streamed closed its connection."""


async def events_of(handle: Handle, request: Request, poll: bool):
    """The one reading of a request's events (both answers, streamed or whole, consume it):
    each in order until every choice has ended. poll: look every half second whether the
    client went away (ClientGone); a streamed answer learns it from its closed generator."""
    while not handle.finished:
        if not poll:
            yield await handle.next_event()
            continue
        try:
            yield await asyncio.wait_for(handle.next_event(), timeout=0.5)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                raise ClientGone() from None


def refused(err: BadRequest, comp: str | None = None) -> JSONResponse:
    return error_response(err.status, err.message, err.kind, err.code, err.headers, comp)


def shutting_down(comp: str) -> JSONResponse:
    return error_response(503, "the server is shutting down; the request was cancelled", "unavailable", comp=comp)


def parsed_tools(req: protocol.GenerateRequest) -> bool:
    return req.tools is not None and req.tools.parsed


async def whole_answer(request: Request, req: protocol.GenerateRequest, handle: Handle, model: str,
                       headers: dict) -> Response:
    """A whole answer: every choice's DoneEvent (its text comes with it), then one JSON body."""
    comp = handle.composition
    choices = [responses.Choice(index, seed) for index, seed in enumerate(handle.seeds)]
    try:
        async for event in events_of(handle, request, poll=True):
            if isinstance(event, FailedEvent):
                return refused(protocol.http_error(event.error), comp)
            if event.reason == "cancelled":
                return shutting_down(comp)
            choice = choices[event.choice]
            choice.reason, choice.completion_tokens = event.reason, event.completion_tokens
            choice.content, choice.tool_calls = event.content, event.tool_calls
            choice.logprobs.extend(event.logprobs)
    except ClientGone:
        return Response(status_code=499, headers=headers)
    except asyncio.CancelledError:
        # the server's shutdown cancelled this handler before the scheduler closed the request
        # (it should not: the scheduler stops first): still the 503 of a request cut by the
        # shutdown, not uvicorn's plain-text 500
        return shutting_down(comp)
    finally:
        handle.cancel()  # no-op once finished; a handler that ends early frees the rows
    request.state.log += (f" completion={sum(c.completion_tokens for c in choices)} "
                          f"finish={','.join(c.reason for c in choices)}")
    body = responses.completion(req, handle.id, comp, model, choices, handle.prompt_tokens)
    return JSONResponse(body, headers=headers)


async def streamed_answer(request: Request, req: protocol.GenerateRequest, handle: Handle, model: str):
    """A streamed answer: a server-sent event per text piece, each choice's end, [DONE]."""
    def sse(doc: dict) -> str:
        return f"data: {json.dumps(doc, ensure_ascii=False)}\n\n"

    comp, rid = handle.composition, handle.id
    choices = [responses.Choice(index, seed) for index, seed in enumerate(handle.seeds)]
    first = [True] * len(choices)
    try:
        async for event in events_of(handle, request, poll=False):
            choice = choices[event.choice]
            if isinstance(event, TextEvent):
                yield sse(responses.chunk(req, rid, comp, model, choice, event.piece, first=first[event.choice],
                                         logprobs=event.logprobs))
                first[event.choice] = False
                continue
            if isinstance(event, FailedEvent):
                failed = protocol.http_error(event.error)
                yield sse(responses.error_body(failed.message, failed.kind, failed.code))
                break
            reason = choice.reason = event.reason
            choice.completion_tokens = event.completion_tokens
            if parsed_tools(req) and (event.content or event.tool_calls):
                yield sse(responses.tool_chunk(req, rid, comp, model, choice, event.content, event.tool_calls,
                                               first=first[event.choice]))
                first[event.choice] = False
            if parsed_tools(req):
                reason = responses.tool_finish(reason, event.tool_calls)
            yield sse(responses.chunk(req, rid, comp, model, choice, None, reason, first=first[event.choice],
                                     logprobs=event.logprobs))
        else:
            request.state.log += (f" completion={sum(c.completion_tokens for c in choices)} "
                                  f"finish={','.join(c.reason for c in choices)}")
            if req.include_usage:
                yield sse(responses.usage_chunk(req, rid, comp, model, handle.prompt_tokens,
                                               sum(c.completion_tokens for c in choices)))
        yield "data: [DONE]\n\n"
    finally:
        handle.cancel()  # the client went away (the generator is closed): drop the rows next step


def build_app(catalog: Catalog, scheduler: Scheduler, metrics: Metrics, *, api_key: str | None = None,
              body_limit: int = DEFAULT_BODY_LIMIT, log: Callable[[str], None] = print):
    def active_id() -> str | None:
        active = catalog.active
        return None if active is None else active.id

    metrics.follow(scheduler.status, catalog.runtime.max_staged)

    async def read_body(request: Request) -> bytes:
        """The body, under the size limit and the body's deadline (408 past it)."""
        chunks, size, started = [], 0, time.monotonic()
        stream = request.stream().__aiter__()
        while True:
            try:
                chunk = await asyncio.wait_for(stream.__anext__(), body_time_left(started, size))
            except StopAsyncIteration:
                return b"".join(chunks)
            except asyncio.TimeoutError:
                raise BadRequest(f"the request body stopped arriving: {size} bytes in {time.monotonic() - started:.0f} s "
                                 f"(allowed: {BODY_TIMEOUT_S:g} s plus one second per {BODY_MIN_RATE} bytes)",
                                 status=408) from None
            size += len(chunk)
            if size > body_limit:
                raise BadRequest(f"the request body is over the limit of {body_limit} bytes", status=413)
            chunks.append(chunk)

    async def read_json(request: Request) -> dict:
        """The body, read under the limit and parsed: a large one on the scheduler's preparing
        thread (the event loop keeps answering meanwhile, and it competes for the GIL with one
        such thread, not many)."""
        body = await read_body(request)
        if len(body) < PARSE_INLINE_BYTES:
            return protocol.parse_body(body)
        try:
            return await scheduler.call_preparing(protocol.parse_body, body)
        except SlmError as err:  # (Busy: that thread has enough waiting)
            raise protocol.http_error(err) from err

    async def generate(request: Request, chat: bool) -> Response:
        try:
            req = protocol.parse_request(await read_json(request), chat)
            try:
                target = await run_in_threadpool(catalog.resolve, req.model)
                # prepared on the scheduler's preparing thread (a prompt too long for the context
                # by its bytes alone is not tokenized)
                handle = await scheduler.submit_async(target, req.generation, stream=req.stream, name=req.model)
            except SlmError as err:
                raise protocol.http_error(err) from err
        except BadRequest as err:
            return refused(err, active_id())
        comp, model = handle.composition, req.model or "active"
        headers = {HEADER: comp, SEED_HEADER: ",".join(str(seed) for seed in handle.seeds)}
        request.state.log = f"comp={comp[len('blake3:'):][:12]} prompt={handle.prompt_tokens}"
        if req.stream:
            return StreamingResponse(streamed_answer(request, req, handle, model), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        return await whole_answer(request, req, handle, model, headers)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def models(request: Request) -> Response:
        try:
            data = await run_in_threadpool(discovery.list_models, catalog)
        except SlmError as err:
            return refused(protocol.http_error(err))
        return JSONResponse({"object": "list", "data": data})

    async def model(request: Request) -> Response:
        try:
            return JSONResponse(await run_in_threadpool(discovery.find_model, catalog, request.path_params["model_id"]))
        except SlmError as err:
            return refused(protocol.http_error(err))

    async def token_endpoint(request: Request, parse, answer) -> Response:
        """The tokenizer endpoints (slm.server.tokens): the body read under the same limit as the
        others and checked, answered on the composition it names (or the active one)."""
        try:
            req = parse(await read_json(request))
            try:
                loaded = await run_in_threadpool(catalog.resolve, req.model)
                return JSONResponse(await answer(scheduler, loaded, req), headers={HEADER: loaded.id})
            except SlmError as err:
                raise protocol.http_error(err) from err
        except BadRequest as err:
            return refused(err)

    async def tokenize(request: Request) -> Response:
        return await token_endpoint(request, tokens.parse_tokenize, tokens.tokenize)

    async def detokenize(request: Request) -> Response:
        return await token_endpoint(request, tokens.parse_detokenize, tokens.detokenize)

    async def render_chat(request: Request) -> Response:
        return await token_endpoint(request, tokens.parse_render_chat, tokens.render_chat)

    async def render_completion(request: Request) -> Response:
        return await token_endpoint(request, tokens.parse_render_completion, tokens.render_completion)

    async def health(request: Request) -> Response:
        # 503 from the first signal on: a router takes the server out before it stops listening
        draining = scheduler.draining
        return JSONResponse({"status": "draining" if draining else "ok"}, status_code=503 if draining else 200)

    async def slm_status(request: Request) -> Response:
        status, engine = await run_in_threadpool(catalog.status), scheduler.status()
        status.update(queue_depth=engine.queued, running=engine.running, prefilling=engine.prefilling,
                      max_batch=engine.max_batch, draining=engine.draining)
        return JSONResponse(status)

    async def get_load(request: Request) -> Response:
        """vllm-router's power_of_two policy polls this: the rows in flight, admitted or queued
        (vllm:num_requests_running + vllm:num_requests_waiting of /metrics, one snapshot)."""
        engine = scheduler.status()
        return JSONResponse({"load": engine.admitted_rows + engine.queued})

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = {404: f"no endpoint {request.url.path}", 405: f"{request.method} is not allowed on "
                   f"{request.url.path}"}.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, message, headers=dict(exc.headers or {}))

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions/render", render_completion, methods=["POST"]),
        Route("/v1/chat/completions/render", render_chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/slm/status", slm_status, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/get_load", get_load, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    return Guard(app, api_key, body_limit, active_id, metrics, log, catalog.runtime.mode)


# The request handlers, the scheduler's thread and the refs/active watcher all log: each line is
# written whole under one lock (print() writes the text and its newline separately, so two
# threads could run two lines together).
# Re-entrant: the SIGTERM handler (slm.server.serve) logs from the main thread between two
# bytecodes of whatever that thread was doing, possibly inside _write_line itself; with a plain
# lock the handler then waited for itself and the server never stopped (test_serve, under load).
_LOG_LOCK = threading.RLock()


def _write_line(stream, text: str) -> None:
    with _LOG_LOCK:
        stream.write(text + "\n")
        stream.flush()


# What a client sends reaches the log (a percent-decoded path, a model name in a message): its
# line breaks and other control characters are written escaped, so that a request can neither
# forge a log line of its own nor write raw bytes into the log
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def stderr_log(line: str) -> None:
    _write_line(sys.stderr, "slm serve: " + _CONTROL.sub(lambda m: repr(m.group())[1:-1], line))


def json_log(line: str) -> None:
    _write_line(sys.stdout, json.dumps({"time": round(time.time(), 3), "log": line}))
