"""Preparing a request: everything between a checked GenerationRequest and the first prefill
chunk, written once for `slm run`, the Python API and the server's scheduler.

prepare(target, request) renders the prompt (the chat template, with the request's tools;
render() alone, for a caller that renders on a thread of its own),
refuses an empty one or one past the context, settles max_tokens (a request that gives none
gets DEFAULT_MAX_TOKENS, or min_tokens if more, or what the context leaves; one that gives more than the context leaves
is refused, wherever it comes from), checks the memory budget, compiles the grammar (a
response_format, or forced tool calls) and gives each of the n choices its seed and logit
processors. What it returns starts each choice's Sequence (slm.engine.generation), which the
scheduler's batch and `slm run`'s batch of one drive alike."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

from slm.engine.budget import check_budget
from slm.engine.generation import LogitProcessor, Sequence, new_sequence
from slm.engine.processors import BAN, processors_for
from slm.engine.request import DEFAULT_MAX_TOKENS, GenerationRequest
from slm.engine.sampling import Sampler, check_processing, choice_seeds
from slm.engine.stops import StopRules
from slm.engine.structured import grammar_for, grammar_masks
from slm.engine.target import MemoryEstimate, Target
from slm.engine.tools import tool_format
from slm.errors import InvalidInput
from slm.model.allocator import release_freed_memory
from slm.model.chat import ChatPrompt, chat_prompt

# A prompt of this many characters or more peaks at tens of megabytes while it is tokenized:
# that memory goes back to the kernel right after
RELEASE_AFTER_CHARS = 64 << 10


@dataclass(frozen=True, eq=False)
class Choice:
    """One of a request's n choices: its sampler's seed and its own logit processors
    (penalties and bias first, a grammar's mask last: what it forbids stays forbidden)."""

    index: int
    seed: int
    processors: tuple[LogitProcessor, ...]


@dataclass(frozen=True, eq=False)
class Prepared:
    """A request ready to run on its target: the prompt's token ids, the request with its
    max_tokens settled, the KV cache each choice needs, its memory estimate and its choices."""

    target: Target
    request: GenerationRequest
    prompt_ids: tuple[int, ...]
    capacity: int  # positions of one choice's KV cache: the prompt and max_tokens
    estimate: MemoryEstimate
    grammar: str | None
    choices: tuple[Choice, ...]

    def sequence(self, choice: Choice, on_text: Callable[[str], None] | None = None,
                 caller: Callable[[int], str | None] | None = None, keep_logits: bool = False) -> Sequence:
        """A choice's sequence: its sampler, stop rules (streaming the text to on_text; caller:
        a reason of the caller's to stop after a token) and a fresh KV cache."""
        req, tok = self.request, self.target.tokenizer
        decode = tok.decode if req.skip_special_tokens else partial(tok.decode, special=True)
        stops = StopRules(() if req.ignore_eos else tok.eos_ids, req.max_tokens, decode, req.stop, on_text=on_text,
                          caller=caller, stop_ids=req.stop_token_ids, min_tokens=req.min_tokens,
                          include_stop=req.include_stop_str_in_output)
        sampler = Sampler(req.temperature, req.top_p, choice.seed, req.top_k, req.min_p)
        return new_sequence(self.target.model, list(self.prompt_ids), sampler, stops, self.capacity,
                            choice.processors, keep_logits, logprobs=req.logprobs)

    def tool_gate(self, send: Callable[[str], None]):
        """With tools whose calls are read out of the answer: the gate through which the
        answer's text streams (prose goes out, calls wait to be read whole); else None."""
        tools = self.request.tools
        if tools is None or not tools.parsed:
            return None
        return tool_format(self.target.tokenizer.chat_template).gate(send)


def prepare(target: Target, request: GenerationRequest, *, mode: str | None = None, memory_budget: int | None = None,
            max_n: int | None = None, keep_logits: bool = False, encode_once: bool = False,
            rendered: ChatPrompt | None = None) -> Prepared:
    """Check a request against its target and prepare its choices (InvalidInput naming what
    does not fit, BudgetExceeded over memory_budget). mode: the numerics mode it runs in
    (slm.model.modes); max_n: the most choices decoded together; keep_logits: every position's
    logits are kept (the estimate counts them); encode_once: the target serves this request
    alone, so its tokenizer keeps only what decoding needs once the prompt is encoded;
    rendered: a chat's prompt as render() made it (else it is rendered here)."""
    req, cfg = request, target.model.cfg
    check_processing(n=req.n, max_n=max_n, logit_bias=dict(req.logit_bias), vocab_size=cfg.vocab_size)
    if req.stop_token_ids and req.stop_token_ids[-1] >= cfg.vocab_size:
        raise InvalidInput(f"stop_token_ids: {req.stop_token_ids[-1]} is not a token id (the vocabulary has "
                           f"{cfg.vocab_size})")
    seeds = choice_seeds(req.seed, req.n)
    ids = prompt_ids(target, req, rendered)
    context = cfg.context_length
    max_tokens = req.max_tokens if req.max_tokens is not None else \
        min(max(DEFAULT_MAX_TOKENS, req.min_tokens), context - len(ids))  # (at least min_tokens: a stop after them)
    if len(ids) + max_tokens > context:
        raise InvalidInput(f"max_tokens {max_tokens} is past the context: the prompt has {len(ids)} tokens "
                           f"and the context holds {context}")
    if req.min_tokens > max_tokens:
        raise InvalidInput(f"min_tokens ({req.min_tokens}) must be at most max_tokens ({max_tokens})")
    req = replace(req, max_tokens=max_tokens)
    estimate = target.memory_estimate(len(ids) + max_tokens, len(ids), sequences=req.n, all_logits=keep_logits,
                                      mode=mode)
    check_budget(estimate, memory_budget, "this request" if req.n == 1 else f"this request ({req.n} choices)")
    ending = req.stop_token_ids + (() if req.ignore_eos else tuple(target.tokenizer.eos_ids))
    if req.min_tokens and len({t for t, b in req.logit_bias if b <= BAN} | set(ending)) >= cfg.vocab_size:
        raise InvalidInput("logit_bias bans every token that min_tokens does not (the end-of-generation and stop "
                           "tokens): nothing is left to generate")
    penalties = processors_for(req.frequency_penalty, req.presence_penalty, req.repeat_penalty, req.logit_bias,
                               repetition_penalty=req.repetition_penalty, prompt_ids=ids,
                               min_tokens=req.min_tokens, ending=ending)
    grammar = grammar_for(target, req.response_format, req.tools)  # (needs the encoder: before its release)
    if encode_once:
        target.tokenizer.release_encoder()
    choices = tuple(Choice(index, seed, penalties + grammar_masks(target, grammar, max_tokens))
                    for index, seed in enumerate(seeds))
    return Prepared(target, req, tuple(ids), len(ids) + max_tokens, estimate, grammar, choices)


def render(target: Target, req: GenerationRequest) -> ChatPrompt | None:
    """A chat request's prompt text: its conversation through the base's chat template, with the
    request's tools in its tool format, opening the assistant's turn (add_generation_prompt) or
    leaving the last message open (continue_final_message); None for a plain prompt. The
    template runs in its bounded process (slm.model.chat), so a server calls this on a thread of its own, never on the
    one that prepares every request: a slow template holds up its own request alone. InvalidInput
    for a template that fails or exceeds a bound, or a conversation that cannot fit by its bytes."""
    if not req.chat:
        return None
    tok = target.tokenizer
    messages, tools = req.conversation, None
    if req.tools is not None:  # (a template with no tool support: InvalidInput)
        messages, tools = tool_format(tok.chat_template).prompt(messages, req.tools.definitions)
    # the bytes a prompt's tokens must cover: a chat's contents (its template adds more)
    check_fits(target, "".join(m.get("content") or "" for m in messages))
    return chat_prompt(tok, messages, req.add_generation_prompt, tools=tools,
                       continue_final_message=req.continue_final_message)


def check_fits(target: Target, text: str) -> None:
    """InvalidInput if `text` cannot fit in the context by its bytes alone: a prompt that cannot
    fit is neither rendered nor tokenized."""
    tok, context = target.tokenizer, target.model.cfg.context_length
    at_least = tok.min_tokens(text)
    if at_least >= context:
        raise InvalidInput(f"the prompt is {len(text.encode('utf-8', 'surrogatepass'))} bytes: at least "
                           f"{at_least} tokens (a token is at most {tok.max_token_bytes} bytes); "
                           f"the context holds {context}")


def prompt_ids(target: Target, req: GenerationRequest, rendered: ChatPrompt | None = None) -> list[int]:
    """The prompt's token ids: the plain prompt, or the conversation as render() renders it
    (`rendered`: already rendered); InvalidInput for one that is empty or fills the context."""
    tok = target.tokenizer
    if req.chat:
        prompt = rendered or render(target, req)
        text = prompt.text
        check_fits(target, text)  # (the template's output, as the contents were before it ran)
    else:
        text = req.prompt
        check_fits(target, text)
    try:  # (message content is text: a control token's text in it stays text)
        ids = prompt.ids(tok) if req.chat else tok.encode(text)
    finally:
        release_after(text)
    if not ids:
        raise InvalidInput("the prompt encodes to no tokens")
    context = target.model.cfg.context_length
    if len(ids) >= context:
        raise InvalidInput(f"the prompt has {len(ids)} tokens; the context holds {context}")
    return ids


def encode(target: Target, text: str, add_special: bool = True) -> list[int]:
    """A text's token ids as the tokenizer gives them, checked against nothing (a text past the
    context is counted: the server's /tokenize)."""
    try:
        return target.tokenizer.encode(text, add_special=add_special)
    finally:
        release_after(text)


def release_after(text: str) -> None:
    """After tokenizing a long text: its peak given back to the kernel, not kept for the next
    (slm.model.allocator)."""
    if len(text) >= RELEASE_AFTER_CHARS:
        release_freed_memory()
