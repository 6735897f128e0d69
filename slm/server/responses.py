"""The OpenAI wire format of answers: whole completions, streamed chunks (text, tool calls,
usage), logprobs in chat's and completions' shapes, error bodies. The requests they answer are
parsed in slm.server.protocol."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from slm.api import ToolCall
from slm.server.protocol import GenerateRequest


def finish_reason(stop_reason: str) -> str:
    """The scheduler's stop reasons -> OpenAI's finish_reason."""
    return {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}.get(stop_reason, stop_reason)


def tool_finish(reason: str, tool_calls: tuple) -> str:
    """The stop reason of an answer that called tools: "tool_calls" when it ended by itself."""
    return "tool_calls" if tool_calls and finish_reason(reason) == "stop" else reason


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass
class Choice:
    """One choice of an answer as it is gathered: its logprobs (slm.TokenLogprobs), seed and,
    once done, its finish reason, token count and text."""

    index: int
    seed: int
    logprobs: list = field(default_factory=list)
    reason: str | None = None
    completion_tokens: int = 0
    offset: int = 0  # completions' text_offset of the next streamed token
    content: str | None = None  # its text (with tools: outside its calls; None: none)
    tool_calls: tuple = ()  # with tools: the calls read from the answer


def _token_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", "surrogatepass"))


def _named(token_ids: bool):
    """How logprobs name a token (a record or an alternative): its text, or (vLLM's
    return_tokens_as_token_ids) "token_id:N", which any token has, whatever its bytes."""
    return (lambda t: f"token_id:{t.token}") if token_ids else (lambda t: t.text)


def chat_logprobs(records, token_ids: bool = False) -> dict:
    """OpenAI chat's choices[].logprobs: content[{token, logprob, bytes, top_logprobs[]}]
    (bytes: the token's text's, whatever names it, as vLLM resolves a token_id:N)."""
    name = _named(token_ids)
    return {"content": [{"token": name(r), "logprob": r.logprob, "bytes": _token_bytes(r.text),
                         "top_logprobs": [{"token": name(a), "logprob": a.logprob, "bytes": _token_bytes(a.text)}
                                          for a in r.top]} for r in records], "refusal": None}


def completion_logprobs(records, offset: int, token_ids: bool = False) -> dict:
    """OpenAI completions' choices[].logprobs: tokens, token_logprobs, top_logprobs (name ->
    logprob; two alternatives with one text keep the likelier), text_offset (each token's
    start in the choice's text, from `offset`)."""
    name, offsets = _named(token_ids), []
    for r in records:
        offsets.append(offset)
        offset += len(r.text)
    return {"tokens": [name(r) for r in records], "token_logprobs": [r.logprob for r in records],
            "top_logprobs": [_by_name(r.top, name) for r in records], "text_offset": offsets}


def _by_name(alternatives, name) -> dict[str, float]:
    out: dict[str, float] = {}
    for a in alternatives:  # most likely first
        out.setdefault(name(a), a.logprob)
    return out


def _logprobs_of(req: GenerateRequest, choice: Choice, records) -> dict | None:
    if req.generation.logprobs is None:
        return None
    if req.chat:
        return chat_logprobs(records, req.token_ids)
    shaped = completion_logprobs(records, choice.offset, req.token_ids)
    choice.offset += sum(len(r.text) for r in records)
    return shaped


def completion(req: GenerateRequest, rid: str, comp_id: str, model: str, choices: list[Choice],
               prompt_tokens: int) -> dict:
    """A whole answer: every choice (with its seed, slm's extension), usage over all of them."""
    out = []
    for c in choices:
        tools = req.tools is not None and req.tools.parsed
        text = c.content if tools else c.content or ""
        if req.echo:
            text = req.echo + (text or "")
        logprobs = _logprobs_of(req, c, c.logprobs)
        message: dict = {"role": req.role, "content": text}
        reason = c.reason
        if c.tool_calls:
            message["tool_calls"] = [_call(call) for call in c.tool_calls]
            reason = tool_finish(reason, c.tool_calls)
        out.append({"index": c.index, "message": message, "logprobs": logprobs,
                    "finish_reason": finish_reason(reason), "seed": c.seed} if req.chat else
                   {"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(reason),
                    "seed": c.seed})
    return {"id": rid, "object": "chat.completion" if req.chat else "text_completion", "created": int(time.time()),
            "model": model, "system_fingerprint": comp_id, "choices": out,
            "usage": usage(prompt_tokens, sum(c.completion_tokens for c in choices))}


def chunk(req: GenerateRequest, rid: str, comp_id: str, model: str, choice: Choice, text: str | None,
          reason: str | None = None, first: bool = False, logprobs=()) -> dict:
    """One streamed piece of one choice (text None: only the finish reason); a chat's first
    names the role and carries the echo."""
    shaped = _logprobs_of(req, choice, list(logprobs))
    if req.chat:
        delta: dict = {"role": req.role, "content": req.echo} if first else {}
        if text is not None:
            delta["content"] = delta.get("content", "") + text
        body = {"index": choice.index, "delta": delta, "logprobs": shaped,
                "finish_reason": finish_reason(reason) if reason else None}
    else:
        body = {"index": choice.index, "text": text or "", "logprobs": shaped,
                "finish_reason": finish_reason(reason) if reason else None}
    return {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": int(time.time()), "model": model, "system_fingerprint": comp_id, "choices": [body]}


def _call(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def tool_chunk(req: GenerateRequest, rid: str, comp_id: str, model: str, choice: Choice, text: str | None,
               tool_calls: tuple, first: bool = False) -> dict:
    """A streamed request with tools, once the answer is complete: the part of its content not
    streamed yet (held back as it might have begun a call) and its calls, as one delta (the
    choice's first: with the echo)."""
    delta: dict = {"role": req.role, "content": req.echo + (text or "") if first and req.echo else text}
    if tool_calls:
        delta["tool_calls"] = [{"index": i, **_call(c)} for i, c in enumerate(tool_calls)]
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "system_fingerprint": comp_id, "choices": [{"index": choice.index, "delta": delta, "logprobs": None,
                                                        "finish_reason": None}]}


def usage_chunk(req: GenerateRequest, rid: str, comp_id: str, model: str, prompt_tokens: int,
                completion_tokens: int) -> dict:
    return {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": int(time.time()), "model": model, "system_fingerprint": comp_id, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
