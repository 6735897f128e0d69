"""A generation request as the scheduler (slm.ops.scheduler) takes it: what to generate and
how, with nothing of the wire format that carried it (slm.server.protocol converts an HTTP
body into one; slm.api exports both types)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system", "user" or "assistant"
    content: str


@dataclass(frozen=True)
class GenerationRequest:
    """A prompt (or a chat) and its sampling options, checked for everything that needs no
    model; what needs the model (the prompt's length against the context, the memory budget)
    the scheduler checks when it prepares the request."""

    chat: bool
    prompt: str  # not chat: the prompt text
    messages: tuple[ChatMessage, ...]  # chat: the conversation
    max_tokens: int
    max_tokens_given: bool  # False: max_tokens is a default, lowered to what the context leaves
    temperature: float
    top_p: float
    seed: int | None  # None: each choice a fresh random seed; s: choice i uses s + i
    stop: tuple[str, ...]  # stop sequences: the text ends before the first one
    n: int = 1  # choices, decoded as rows of the batch (at most the scheduler's max_batch)
    top_k: int = 0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs; ids checked against the vocabulary
    logprobs: int | None = None  # None: none; k: each token's logprob and its k most likely alternatives
