"""vLLM's request fields beyond OpenAI's, and the ones vLLM-compatible routers add to every
request (vllm-router, a fork of the SGLang router, writes its own defaults into each body it
forwards: `no_stop_trim`, `ignore_eos`, `skip_special_tokens`, `return_hidden_states`, chat's
`continue_final_message`, `separate_reasoning`, `stream_reasoning`, `include_reasoning`).
slm.server.protocol's allowlists include these; docs/serve.md's table gives each its meaning.

The generation options go into the GenerationRequest as they are (it checks them, InvalidInput
naming the field, as for `slm run` and the API); the others shape the answer on the wire
(wire_options): they need nothing the engine does.
"""

from __future__ import annotations

from slm import InvalidInput
from slm.api import GenerationRequest

# GenerationRequest's options of the same name (slm.engine.request)
GENERATION = frozenset({"min_tokens", "ignore_eos", "stop_token_ids", "include_stop_str_in_output",
                        "skip_special_tokens", "repetition_penalty"})
CHAT_GENERATION = frozenset({"add_generation_prompt", "continue_final_message"})

# The fields each endpoint reads beyond OpenAI's (besides protocol's own).
FIELDS = {
    "completions": GENERATION | {"return_tokens_as_token_ids", "return_hidden_states"},
    "chat": GENERATION | CHAT_GENERATION | {"return_tokens_as_token_ids", "return_hidden_states", "echo"},
}

# Accepted, no effect (they cannot change an answer from slm):
# - no_stop_trim: SGLang's, not vLLM's: vLLM ignores it (its unknown fields are logged and
#   dropped), so its answer trims a stop sequence whatever the value; so does slm's
#   (include_stop_str_in_output is vLLM's way to keep it);
# - separate_reasoning, stream_reasoning (SGLang's), include_reasoning (vLLM's): they act on a
#   reasoning parser's split of the answer, which slm does not make: the answer is all content.
IGNORED = frozenset({"no_stop_trim", "separate_reasoning", "stream_reasoning", "include_reasoning"})

# Fields the router's request types carry (SGLang's: sent when a client gives them) and vLLM's
# chat_template_kwargs, which slm does not implement: 400 "unsupported field" (a JSON schema is
# response_format's; an adapter is named in `model`, as a composition).
UNSUPPORTED = frozenset({"regex", "ebnf", "json_schema", "lora_path", "session_params", "sampling_seed",
                         "chat_template_kwargs"})

# Fields whose one no-op value is accepted, as the router sends them; any other value is a 400.
NO_OPS = {"return_hidden_states": False}


def generation_options(doc: dict, chat: bool) -> dict:
    """The GenerationRequest options a body gives (a null one is absent), as sent."""
    names = GENERATION | CHAT_GENERATION if chat else GENERATION
    return {name: doc[name] for name in names if doc.get(name) is not None}


def wire_options(doc: dict, generation: GenerationRequest) -> dict:
    """The answer's shape (slm.server.protocol.GenerateRequest's fields): chat's `role`, the
    last message's when add_generation_prompt is false (vLLM's rule); `echo`, the text that
    goes before each chat answer (the last message's, if it has the answer's role);
    `token_ids`: logprobs name tokens "token_id:N" (return_tokens_as_token_ids)."""
    for name in ("echo", "return_tokens_as_token_ids"):
        if doc.get(name) is not None and not isinstance(doc[name], bool):
            raise InvalidInput(f"{name} must be true or false")
    if not generation.chat:
        return {"token_ids": bool(doc.get("return_tokens_as_token_ids"))}
    last = generation.messages[-1]
    role = "assistant" if generation.add_generation_prompt else last.role
    echo = (last.content or "") if doc.get("echo") and last.role == role else ""
    return {"role": role, "echo": echo, "token_ids": bool(doc.get("return_tokens_as_token_ids"))}
