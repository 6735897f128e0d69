"""The tokenizer endpoints: POST /tokenize and /detokenize (vLLM's shapes, and llama-server's
/tokenize form beside them), POST /v1/chat/completions/render and /v1/completions/render
(vLLM's: the token ids a generation request would run on, which a cache-aware router hashes).

Each body is checked here into a typed request, every field read or refused by name (400), as
slm.server.protocol checks the generation bodies; the answers are made from what generation
itself uses: a chat's token ids (a /tokenize with messages) are the scheduler's own
(Scheduler.prompt_ids: the same rendering of the chat template in its bounded process and the
same tokenizing as a submitted request), and a render's body is parsed as its generation
endpoint parses it (protocol.parse_request) and checked and prepared as a submitted request is
(Scheduler.check: the same 400s), nothing queued.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from slm import InvalidInput
from slm.api import GenerationRequest, Tools
from slm.server.protocol import BadRequest, GenerateRequest, flag, model_field, parse_messages, parse_request

# A /detokenize body is parsed whole under the body limit; its list is bounded too, before any
# id is looked up or decoded: a 128k context's worth
MAX_DETOKENIZE_TOKENS = 1 << 17

LLAMA_FIELDS = frozenset({"content", "add_special", "with_pieces", "model"})
PROMPT_FIELDS = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
CHAT_FIELDS = frozenset({"model", "messages", "add_generation_prompt", "continue_final_message", "add_special_tokens",
                         "return_token_strs", "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "tools"})
DETOKENIZE_FIELDS = frozenset({"tokens", "model"})
# vLLM's chat form: fields read only at the value generation itself uses; another value is a
# 400 naming the field (what it would ask for is not implemented)
CHAT_ONLY = (("add_special_tokens", False, "a chat's prompt gets the base's BOS once, as generation gives it"),)


@dataclass(frozen=True)
class TextTokenize:
    """A text to tokenize as it stands: vLLM's {"prompt"} form or llama-server's {"content"}."""

    model: str | None
    text: str
    add_special: bool
    token_strs: bool  # vLLM's return_token_strs
    pieces: bool  # llama-server's with_pieces
    llama: bool  # answer in llama-server's shape


@dataclass(frozen=True)
class ChatTokenize:
    """vLLM's {"messages"} form: the conversation as a chat completion would render it."""

    model: str | None
    generation: GenerationRequest
    token_strs: bool


def parse_tokenize(doc: dict) -> TextTokenize | ChatTokenize:
    """Which form a /tokenize body is, told by its fields (content: llama-server's; prompt or
    messages: vLLM's), checked whole."""
    forms = [key for key in ("content", "prompt", "messages") if doc.get(key) is not None]
    if len(forms) > 1:
        raise BadRequest(f"give one of content, prompt or messages, not {' and '.join(forms)}")
    form = forms[0] if forms else "content"
    if form == "content":
        _only(doc, LLAMA_FIELDS)
        return TextTokenize(model_field(doc), _text(doc, "content"), flag(doc, "add_special", False), False,
                            flag(doc, "with_pieces", False), True)
    if form == "prompt":
        _only(doc, PROMPT_FIELDS)
        return TextTokenize(model_field(doc), _text(doc, "prompt"), flag(doc, "add_special_tokens", True),
                            flag(doc, "return_token_strs", False), False, False)
    _only(doc, CHAT_FIELDS)
    for key, only, why in CHAT_ONLY:
        if flag(doc, key, only) != only:
            raise BadRequest(f"unsupported field: {key} (only {json.dumps(only)}: {why})")
    if doc.get("chat_template") is not None:
        raise BadRequest("unsupported field: chat_template (a request's own template is not run: slm renders "
                         "the base's)")
    for key in ("chat_template_kwargs", "mm_processor_kwargs"):
        if doc.get(key) not in (None, {}):
            raise BadRequest(f"unsupported field: {key} (only {{}}: slm passes the template no extra variables)")
    try:
        generation = GenerationRequest(messages=parse_messages(doc), chat=True, tools=Tools.of(doc.get("tools"), None, None),
                                       add_generation_prompt=flag(doc, "add_generation_prompt", True),
                                       continue_final_message=flag(doc, "continue_final_message", False))
    except InvalidInput as err:
        raise BadRequest(str(err)) from err
    return ChatTokenize(model_field(doc), generation, flag(doc, "return_token_strs", False))


def _only(doc: dict, fields: frozenset) -> None:
    """400 naming the first field not in `fields` (a null one is absent)."""
    for key, value in doc.items():
        if key not in fields and value is not None:
            raise BadRequest(f"unknown field: {key}")


def _text(doc: dict, key: str) -> str:
    text = doc.get(key)
    if not isinstance(text, str):
        raise BadRequest(f"{key} must be a string")
    return text


@dataclass(frozen=True)
class Detokenize:
    """A /detokenize body: the ids to decode (integers, not yet checked against a vocabulary)."""

    model: str | None
    tokens: list[int]


def parse_detokenize(doc: dict) -> Detokenize:
    """{"tokens": [ids], "model"} (vLLM's and llama-server's alike): at most
    MAX_DETOKENIZE_TOKENS integers."""
    _only(doc, DETOKENIZE_FIELDS)
    tokens = doc.get("tokens")
    if not isinstance(tokens, list):
        raise BadRequest("tokens must be a list of token ids (integers)")
    if len(tokens) > MAX_DETOKENIZE_TOKENS:
        raise BadRequest(f"tokens: at most {MAX_DETOKENIZE_TOKENS} token ids, not {len(tokens)}")
    bad = [t for t in tokens if not isinstance(t, int) or isinstance(t, bool)]
    if bad:
        raise BadRequest(f"tokens must be a list of token ids (integers), not {json.dumps(bad[0])[:40]}")
    return Detokenize(model_field(doc), tokens)


def parse_render_chat(doc: dict) -> GenerateRequest:
    """A render's body: the generation request it renders, checked as its endpoint checks it."""
    return parse_request(doc, chat=True)


def parse_render_completion(doc: dict) -> GenerateRequest:
    return parse_request(doc, chat=False)


# -- answers (on a staged composition, the text's work on the scheduler's preparing thread) ----
async def tokenize(scheduler, loaded, req: TextTokenize | ChatTokenize) -> dict:
    if isinstance(req, ChatTokenize):
        return tokenize_response(loaded, await scheduler.prompt_ids(loaded, req.generation), req.token_strs)
    ids = await scheduler.tokenize(loaded, req.text, req.add_special)
    return await scheduler.call_preparing(text_answer, loaded, req, ids)


async def detokenize(scheduler, loaded, req: Detokenize) -> dict:
    return await scheduler.call_preparing(decode, loaded, req.tokens)


async def render_chat(scheduler, loaded, req: GenerateRequest) -> dict:
    """/v1/chat/completions/render: one GenerateRequest (checked as its generation would be)."""
    return rendered(req, await scheduler.check(loaded, req.generation))


async def render_completion(scheduler, loaded, req: GenerateRequest) -> list[dict]:
    """/v1/completions/render: one GenerateRequest per prompt (slm takes one)."""
    return [rendered(req, await scheduler.check(loaded, req.generation))]


def text_answer(loaded, req: TextTokenize, ids: list[int]) -> dict:
    """A text's token ids: vLLM's {count, max_model_len, tokens, token_strs} or llama-server's
    {"tokens"} (with_pieces: [{"id", "piece"}])."""
    tok = loaded.tokenizer
    if req.llama:
        return {"tokens": [{"id": i, "piece": _piece(tok.piece_bytes(i))} for i in ids] if req.pieces else ids}
    return tokenize_response(loaded, ids, req.token_strs)


def tokenize_response(loaded, ids: list[int], token_strs: bool) -> dict:
    """vLLM's TokenizeResponse of `ids`."""
    return {"count": len(ids), "max_model_len": loaded.context_length, "tokens": ids,
            "token_strs": [loaded.tokenizer.token_text(i) for i in ids] if token_strs else None}


def _piece(data: bytes) -> str | list[int]:
    """A piece as text, or as its byte values when it is part of a character (llama-server's shape)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def decode(loaded, tokens: list[int]) -> dict:
    """The text of `tokens` (a control token's text included, as vLLM and llama-server give it):
    vLLM's {"prompt"} with llama-server's {"content"} beside it; a token id outside the
    vocabulary is InvalidInput naming it."""
    vocab = loaded.vocab_size
    bad = next((t for t in tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidInput(f"token ids must be in [0, {vocab}); got {bad}")
    text = loaded.tokenizer.decode(list(tokens), special=True)
    return {"prompt": text, "content": text}


def rendered(req: GenerateRequest, prepared) -> dict:
    """vLLM's render answer, a GenerateRequest: the prompt's token ids with the sampling
    parameters the request runs with (vLLM's names; max_tokens resolved: what its answer may run to),
    from `prepared` (Scheduler.check: the request checked as its generation is)."""
    g, ids = prepared.request, list(prepared.prompt_ids)
    params = {"n": g.n, "temperature": g.temperature, "top_p": g.top_p, "top_k": g.top_k, "min_p": g.min_p,
              "seed": g.seed, "max_tokens": g.max_tokens, "stop": list(g.stop),
              "presence_penalty": g.presence_penalty, "frequency_penalty": g.frequency_penalty,
              "repetition_penalty": g.repetition_penalty, "min_tokens": g.min_tokens, "ignore_eos": g.ignore_eos,
              "stop_token_ids": list(g.stop_token_ids), "include_stop_str_in_output": g.include_stop_str_in_output,
              "skip_special_tokens": g.skip_special_tokens, "logprobs": g.logprobs}
    return {"request_id": uuid.uuid4().hex, "token_ids": ids, "features": None, "sampling_params": params,
            "model": req.model or "active", "stream": req.stream, "stream_options": None, "cache_salt": None}
