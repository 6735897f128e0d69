"""Chat templates (jinja2, sandboxed, with the conventions of Hugging Face templates)."""

from __future__ import annotations

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from slm.errors import InvalidInput


def _raise(message: str):
    raise TemplateError(message)


def render_chat(template: str | None, messages: list[dict], special_tokens: dict[str, str]) -> str:
    if not template:
        raise InvalidInput("this base has no chat template; run without --chat")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=True, **special_tokens
        )
    except TemplateError as err:
        raise InvalidInput(f"chat template failed: {err}") from err
