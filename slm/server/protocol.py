"""The OpenAI wire format: request bodies checked into typed requests, results into responses.

A body's JSON is mapped here to a slm.api.GenerationRequest, which checks every option as
`slm run` and the API's are checked (one-line messages, HTTP 4xx); this module checks only the
wire's own shape and OpenAI's narrower ranges. What needs the model (the prompt's length
against the context, logit_bias's token ids against the vocabulary, n against max_batch) is
the scheduler's preparation (slm.api.Runtime.scheduler's submit). Every slm error becomes its
HTTP status in one place, http_error.

No field is ignored silently: FIELDS lists, per endpoint, every request field slm reads;
IGNORED the few that cannot change an answer (accepted, no effect); any other field is a 400
naming it, "unsupported field" for one OpenAI defines and slm does not implement
(UNSUPPORTED), "unknown field" for one nobody defines (a typo must not pass). A field sent as
null is as if absent. docs/serve.md has the table.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from slm import Busy, ExitCode, InvalidInput, NotFound, ShuttingDown, SlmError
from slm.api import ChatMessage, GenerationRequest, ResponseFormat, ToolCall, Tools, check_processing, check_sampling
from slm.server import dialect

MAX_MESSAGES = 1024
ROLES = ("system", "user", "assistant", "tool")
MAX_TEMPERATURE = 2.0  # OpenAI's range (slm run takes any finite temperature >= 0)

# Every request field each endpoint implements (the one allowlist: a field is added here when
# slm implements it). top_k, min_p and repeat_penalty are llama-server's and vLLM's extensions.
_SAMPLING = frozenset({"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
                       "n", "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "top_k", "min_p",
                       "repeat_penalty", "response_format"})
FIELDS = {
    # (echo, best_of, suffix: only their no-op values)
    "completions": _SAMPLING | dialect.FIELDS["completions"] | {"prompt", "echo", "best_of", "suffix"},
    "chat": _SAMPLING | dialect.FIELDS["chat"] | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                                                  "tool_choice", "parallel_tool_calls"},
}
# Accepted and ignored: they cannot change an answer (an end-user id, a label, whether OpenAI
# keeps the request, a billing tier, how long its prompt cache keeps a prefix).
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
                     "prompt_cache_retention", "prompt_cache_options"}) | dialect.IGNORED
# OpenAI defines these; slm does not implement them (the tool fields: not on completions): 400
# "unsupported field".
UNSUPPORTED = frozenset({"audio", "modalities", "prediction", "web_search_options", "functions", "function_call",
                         "reasoning_effort", "verbosity", "tools", "tool_choice", "parallel_tool_calls", "suffix",
                         "echo", "best_of", "moderation"}) | dialect.UNSUPPORTED


class BadRequest(Exception):
    """A client error: an HTTP status and a one-line message."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.kind, self.headers = " ".join(message.split()), status, kind, headers or {}
        self.code = code


# slm's errors (their exit codes) -> HTTP: the client named or sent something wrong (4xx) vs.
# the store or the machine failing under a good request (5xx). A signed statement the device's
# trust policy refuses (an older version, another composition at the running version, an expired
# one, one for another tag) is a 403: what it names is not to be served, and asking again will not
# change that; a composition that fails its health checks a 422, as non-finite logits are.
STATUS_OF_CODE = {ExitCode.INVALID_INPUT: 400, ExitCode.INCOMPATIBLE: 400,
                  ExitCode.BUDGET: 400, ExitCode.USAGE: 400, ExitCode.NUMERICS: 422,
                  ExitCode.ROLLBACK: 403, ExitCode.EQUIVOCATION: 403, ExitCode.EXPIRED: 403,
                  ExitCode.WRONG_TARGET: 403, ExitCode.UNHEALTHY: 422}
# the error's `code` field where the status alone does not tell what was refused
CODE_NAMES = {ExitCode.ROLLBACK: "rollback_refused", ExitCode.EQUIVOCATION: "equivocation_refused",
              ExitCode.EXPIRED: "statement_expired", ExitCode.WRONG_TARGET: "wrong_target",
              ExitCode.UNHEALTHY: "unhealthy"}
RETRY_AFTER_S = "1"  # a full server: a slot frees when any running request ends


def http_error(err: Exception) -> BadRequest:
    """The one mapping of an slm error to an HTTP answer: ShuttingDown 503, Busy (a full server)
    429 with Retry-After, NotFound (a `model` no name resolves to: the server looks nothing else
    up) 404 model_not_found as OpenAI and vLLM answer, a client's mistake 400 (a `model` that is
    not a spec's syntax included), non-finite logits and a failed health check 422, a refused
    signed statement 403, any other slm error 500; an exception that is not an slm error is a
    bug: 500 naming it."""
    if not isinstance(err, SlmError):
        return BadRequest(f"internal error: {type(err).__name__}: {err}", status=500, kind="server_error")
    if isinstance(err, ShuttingDown):
        return BadRequest(str(err), status=503, kind="unavailable")
    if isinstance(err, Busy):
        return BadRequest(str(err), status=429, kind="rate_limit_exceeded", headers={"Retry-After": RETRY_AFTER_S})
    if isinstance(err, NotFound):
        return BadRequest(str(err), status=404, code="model_not_found")
    status = STATUS_OF_CODE.get(err.code, 500)
    return BadRequest(str(err), status=status, kind="invalid_request_error" if status < 500 else "server_error",
                      code=CODE_NAMES.get(err.code))


@dataclass(frozen=True)
class GenerateRequest:
    """One /v1/completions or /v1/chat/completions request: its wire fields beside the
    GenerationRequest it carries (what the engine runs)."""

    generation: GenerationRequest
    model: str | None  # None or "active": the active composition at admission
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts
    role: str = "assistant"  # chat: the answer's role (slm.server.dialect.wire_options)
    echo: str = ""  # chat: the text before each answer (vLLM's echo)
    token_ids: bool = False  # logprobs name tokens "token_id:N" (vLLM's return_tokens_as_token_ids)

    @property
    def chat(self) -> bool:
        return self.generation.chat

    @property
    def n(self) -> int:
        return self.generation.n

    @property
    def tools(self) -> Tools | None:
        return self.generation.tools


def parse_body(body: bytes) -> dict:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise BadRequest(f"the request body is not valid JSON ({type(err).__name__})") from err
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    return doc


def _number(doc: dict, key: str, default: float) -> float:
    value = doc.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{key} must be a number")
    if not math.isfinite(value):
        raise BadRequest(f"{key} must be a finite number, not {value}")
    return float(value)


def _integer(doc: dict, key: str, default: int | None) -> int | None:
    value = doc.get(key, default)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer")
    return value


def parse_messages(doc: dict) -> tuple[ChatMessage, ...]:
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"at most {MAX_MESSAGES} messages, not {len(messages)}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        calls = _tool_calls(m.get("tool_calls"), i) if role == "assistant" else ()
        if content is None and calls:  # an assistant turn that only called tools
            out.append(ChatMessage(role, None, calls))
            continue
        if isinstance(content, list):  # the content-parts form: text parts only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise BadRequest(f"messages[{i}].content: only text parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string")
        call_id = m.get("tool_call_id")
        if role == "tool" and not isinstance(call_id, str):
            raise BadRequest(f"messages[{i}]: a tool message needs tool_call_id (the call it answers)")
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise BadRequest(f"messages[{i}].name must be a string")
        out.append(ChatMessage(role, content, calls, call_id if role == "tool" else None, name))
    return tuple(out)


def _tool_calls(calls, i: int) -> tuple[ToolCall, ...]:
    """An assistant message's tool_calls: [{id, type: function, function: {name, arguments}}]."""
    if calls is None:
        return ()
    if not isinstance(calls, list):
        raise BadRequest(f"messages[{i}].tool_calls must be a list")
    out = []
    for k, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not (isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("arguments"), str)
                and isinstance(c.get("id"), str)):
            raise BadRequest(f"messages[{i}].tool_calls[{k}] must be {{id, type: function, function: "
                             "{name, arguments (JSON text)}}")
        out.append(ToolCall(c["id"], f["name"], f["arguments"]))
    return tuple(out)


def _tools(doc: dict, chat: bool) -> Tools | None:
    """tools, tool_choice and parallel_tool_calls (chat only), checked by the API's parser."""
    given = [k for k in ("tools", "tool_choice", "parallel_tool_calls") if doc.get(k) is not None]
    if not chat:
        if given:
            raise BadRequest(f"{given[0]} is for /v1/chat/completions")
        return None
    return Tools.of(doc.get("tools"), doc.get("tool_choice"), doc.get("parallel_tool_calls"))


def _prompt(doc: dict) -> str:
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise BadRequest("prompt must be one string (batches of prompts and token arrays are not supported)")
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be a non-empty string")
    return prompt


def check_fields(doc: dict, chat: bool) -> None:
    """400 naming the first field slm neither implements nor may ignore (a null one is absent)."""
    allowed = FIELDS["chat" if chat else "completions"] | IGNORED
    for key, value in doc.items():
        if key in allowed or value is None:
            continue
        if not chat and key in FIELDS["chat"]:
            raise BadRequest(f"unsupported field: {key} (on chat completions only)")
        kind = "unsupported" if key in UNSUPPORTED else "unknown"
        raise BadRequest(f"{kind} field: {key}" + (" (slm does not implement it; docs/serve.md)"
                                                     if kind == "unsupported" else ""))
    # fields whose one no-op value is accepted (clients and routers send their defaults)
    n = doc.get("n")
    no_ops = {"suffix": "", "best_of": 1 if n is None else n, **dialect.NO_OPS} | ({} if chat else {"echo": False})
    for key, no_op in no_ops.items():
        value = doc.get(key)
        if value is not None and (value != no_op or isinstance(no_op, bool) and not isinstance(value, bool)):
            raise BadRequest(f"unsupported field: {key} (only {json.dumps(no_op)}; slm does not implement it"
                             f"{dialect.NO_OP_HINTS.get(key, '')})")


def _logprobs(doc: dict, chat: bool) -> int | None:
    """How many alternatives per token (None: no logprobs): chat's logprobs (bool) with
    top_logprobs (0..20), completions' logprobs (0..20)."""
    if not chat:
        return _integer(doc, "logprobs", None)
    wanted = doc.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise BadRequest("logprobs must be true or false")
    top = _integer(doc, "top_logprobs", None)
    if top is not None and not wanted:
        raise BadRequest("top_logprobs needs logprobs: true")
    check_processing(logprobs=top, logprobs_name="top_logprobs")  # (InvalidInput naming chat's field)
    return (top or 0) if wanted else None


def parse_request(doc: dict, chat: bool) -> GenerateRequest:
    """A request body as its GenerationRequest (which checks every option) and wire fields;
    OpenAI's narrower ranges (temperature up to 2, max_tokens at least 1) are checked here."""
    check_fields(doc, chat)
    key = "max_completion_tokens" if chat and doc.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(doc, key, None)
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest(f"{key} must be at least 1, not {max_tokens}")
    temperature, top_p, seed = _number(doc, "temperature", 0.0), _number(doc, "top_p", 1.0), _integer(doc, "seed", None)
    try:
        check_sampling(temperature, top_p, seed, MAX_TEMPERATURE)  # OpenAI's range: the sampler's own check
        generation = GenerationRequest(
            prompt="" if chat else _prompt(doc), messages=parse_messages(doc) if chat else None, chat=chat,
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=doc.get("stop"),
            n=_integer(doc, "n", 1), top_k=_integer(doc, "top_k", 0), min_p=_number(doc, "min_p", 0.0),
            frequency_penalty=_number(doc, "frequency_penalty", 0.0),
            presence_penalty=_number(doc, "presence_penalty", 0.0),
            repeat_penalty=_number(doc, "repeat_penalty", 1.0), logit_bias=doc.get("logit_bias"),
            logprobs=_logprobs(doc, chat), response_format=ResponseFormat.of(doc.get("response_format")),
            tools=_tools(doc, chat), **dialect.generation_options(doc, chat))
        wire = dialect.wire_options(doc, generation)
    except InvalidInput as err:
        raise BadRequest(str(err)) from err
    return GenerateRequest(generation, model_field(doc), flag(doc, "stream", False), _include_usage(doc), **wire)


def _include_usage(doc: dict) -> bool:
    options = doc.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict):  # [] or "" too: only an object or null (not just any falsy value)
        raise BadRequest("stream_options must be an object or null")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise BadRequest("stream_options.include_usage must be true or false")
    return bool(include_usage)


def model_field(doc: dict) -> str | None:
    model = doc.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise BadRequest("model must be a non-empty string: 'active', a composition id or prefix, "
                         "or BASE+ADAPTER@W+...")
    return None if model in (None, "active") else model.strip()


def flag(doc: dict, key: str, default: bool) -> bool:
    value = doc.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{key} must be true or false")
    return value


# -- responses -------------------------------------------------------------------------------
