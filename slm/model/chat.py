"""Chat templates: a model's own jinja2 template, rendered as transformers' apply_chat_template
renders it (same sandbox, options, filters and globals), or a fallback per architecture for files
that carry none (Gemma 3's GGUF has no tokenizer.chat_template).

jinja2 is imported on the first render, not with this module: `slm run` without --chat never
pays for it.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from slm.errors import InvalidInput

# Gemma 3's turn format, spelled our own way; it renders what Google's template renders for
# text and image content (tests/test_chat.py compares the two): a system message opens the
# first user turn, the assistant's role is "model", every content is trimmed.
GEMMA3_TEMPLATE = r"""
{%- macro content_text(content) -%}
  {%- if content is string -%}
    {{- content | trim -}}
  {%- elif content is iterable -%}
    {%- for item in content -%}
      {%- if item.type == 'image' -%}{{- '<start_of_image>' -}}
      {%- elif item.type == 'text' -%}{{- item.text | trim -}}
      {%- endif -%}
    {%- endfor -%}
  {%- else -%}
    {{- raise_exception('Invalid content type') -}}
  {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if has_system -%}
  {%- set system = messages[0].content -%}
  {%- set prefix = (system if system is string else system[0].text) ~ '\n\n' -%}
{%- endif -%}
{%- for message in (messages[1:] if has_system else messages) -%}
  {%- if (message.role == 'user') != (loop.index0 is even) -%}
    {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
  {%- endif -%}
  {{- '<start_of_turn>' ~ ('model' if message.role == 'assistant' else message.role) ~ '\n' -}}
  {{- prefix if has_system and loop.first else '' -}}
  {{- content_text(message.content) ~ '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""

# general.architecture -> the template to use when the file has none
FALLBACK_TEMPLATES = {"gemma3": GEMMA3_TEMPLATE}


def fallback_template(architecture: str | None) -> str | None:
    return FALLBACK_TEMPLATES.get(architecture) if architecture else None


def render_chat(template: str | None, messages: list[dict], special_tokens: dict[str, str],
                add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}]), as transformers'
    apply_chat_template(messages, tokenize=False, add_generation_prompt=...) gives it."""
    if not template:
        raise InvalidInput("this base has no chat template; run without --chat")
    from jinja2 import TemplateError

    # transformers drops keys whose value is None: templates test for a missing key
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    try:
        return _compile(template).render(
            messages=messages, tools=None, documents=None,
            add_generation_prompt=add_generation_prompt, **special_tokens,
        )
    except TemplateError as err:
        raise InvalidInput(f"chat template failed: {err}") from err


@lru_cache(maxsize=8)
def _compile(template: str):
    return _environment().from_string(template)


@lru_cache(maxsize=1)
def _environment():
    """The environment of transformers' chat templates (utils/chat_template_utils.py)."""
    import jinja2.ext
    from jinja2 import TemplateError, nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %} marks the assistant's text for training masks;
        rendering keeps the body as is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja2's own tojson escapes <, >, & and ' for HTML; templates expect plain JSON
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env
