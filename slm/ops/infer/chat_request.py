"""A chat request's prompt: its messages and tools through its base's chat template."""

from __future__ import annotations

from slm.engine.tools import tool_format
from slm.errors import InvalidInput
from slm.model.chat import ChatPrompt, chat_prompt


def check_fits(tok, text: str, context: int) -> None:
    """InvalidInput if `text` cannot fit in the context by its bytes alone: a prompt that cannot
    fit is neither rendered nor tokenized."""
    at_least = tok.min_tokens(text)
    if at_least >= context:
        raise InvalidInput(f"the prompt is {len(text.encode('utf-8', 'surrogatepass'))} bytes: at least "
                           f"{at_least} tokens (a token is at most {tok.max_token_bytes} bytes); "
                           f"the context holds {context}")


def render_request(loaded, req) -> ChatPrompt:
    """The prompt of a chat GenerationRequest on `loaded` (InvalidInput for a template that fails
    or exceeds a bound, or has no tool support for the request's tools)."""
    tok = loaded.tokenizer
    messages = [m.to_template() for m in req.messages]
    tools = req.tools.definitions if req.tools is not None else None
    if tools:
        messages, tools = tool_format(tok.chat_template).prompt(messages, tools)
    # the bytes a prompt's tokens must cover: a chat's contents (its template adds more)
    check_fits(tok, "".join(m.get("content") or "" for m in messages), loaded.model.cfg.context_length)
    return chat_prompt(tok, messages, tools=tools)
