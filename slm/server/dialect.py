"""vLLM's request fields beyond OpenAI's, and the ones vLLM-compatible routers add to every
request (vllm-router, a fork of the SGLang router, writes its own defaults into each body it
forwards: `no_stop_trim`, `ignore_eos`, `skip_special_tokens`, `return_hidden_states`, chat's
`continue_final_message`, `separate_reasoning`, `stream_reasoning`, `include_reasoning`).
slm.server.protocol's allowlists include these; docs/serve.md's table gives each its meaning.
"""

from __future__ import annotations

# The fields each endpoint reads beyond OpenAI's (besides protocol's own).
FIELDS = {
    "completions": frozenset({"ignore_eos", "skip_special_tokens", "return_hidden_states"}),
    "chat": frozenset({"ignore_eos", "skip_special_tokens", "return_hidden_states", "continue_final_message"}),
}

# Accepted, no effect (they cannot change an answer from slm):
# - no_stop_trim: SGLang's, not vLLM's: vLLM ignores it (its unknown fields are logged and
#   dropped), so its answer trims a stop sequence whatever the value; so does slm's
#   (include_stop_str_in_output is vLLM's way to keep it);
# - separate_reasoning, stream_reasoning (SGLang's), include_reasoning (vLLM's): they act on a
#   reasoning parser's split of the answer, which slm does not make: the answer is all content.
IGNORED = frozenset({"no_stop_trim", "separate_reasoning", "stream_reasoning", "include_reasoning"})

# Fields whose one no-op value is accepted, as the router sends them; any other value is a 400.
NO_OPS = {"ignore_eos": False, "skip_special_tokens": True, "return_hidden_states": False,
          "continue_final_message": False}
