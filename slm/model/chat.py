"""Chat templates: a model's own jinja2 template, rendered as transformers' apply_chat_template
renders it (same sandbox, options, filters and globals), or a fallback per architecture for files
that carry none (Gemma 3's GGUF has no tokenizer.chat_template).

A template is code that came with a file: it is rendered in a separate, bounded process
(slm.model.template_sandbox), never in the caller's; render_here is what that process runs,
with guards that turn the common ways to exhaust it (a huge range, a string or list repeated
past the output cap, an enormous power) into a refusal before any memory is spent.

jinja2 is imported on the first render, not with this module: `slm run` without --chat never
pays for it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from slm.errors import InvalidInput
from slm.model import template_sandbox

# Gemma 3's turn format, spelled our own way; it renders what Google's template renders for
# text and image content (tests/real/test_chat.py compares the two): a system message opens the
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
                add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}]), as transformers'
    apply_chat_template(messages, tools=..., tokenize=False, add_generation_prompt=...) gives it,
    rendered in the bounded renderer process (InvalidInput if the template fails or exceeds a
    bound: slm.model.template_sandbox)."""
    if not template:
        raise InvalidInput("this base has no chat template; run without --chat")
    # transformers drops keys whose value is None: templates test for a missing key
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    return template_sandbox.render({"template": template, "messages": messages, "tools": tools or None,
                                    "add_generation_prompt": add_generation_prompt,
                                    "special_tokens": special_tokens})


# Conversations a template must be able to render (one of them) when a base is imported or
# pulled: a template that demands a system message, or forbids one, renders one of these.
PROBES = (
    [{"role": "user", "content": "Hello."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello."}],
    [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."},
     {"role": "user", "content": "How are you?"}],
)


def check_template(template: str | None, special_tokens: dict[str, str]) -> None:
    """InvalidInput if `template` exceeds a bound on a plain conversation, or renders none of
    PROBES: found when the base is imported, not at its first chat. No template is fine (a base
    for completions)."""
    if not template:
        return
    failures = []
    for messages in PROBES:
        try:
            render_chat(template, messages, special_tokens)
            return
        except template_sandbox.BoundExceeded as err:
            raise InvalidInput(f"{err} (a plain conversation)") from err
        except InvalidInput as err:
            failures.append(err)
    raise InvalidInput(f"the chat template renders no plain conversation: {failures[0]}")


def render_here(template: str, messages: list[dict], special_tokens: dict[str, str],
                add_generation_prompt: bool, tools: list[dict] | None, max_chars: int) -> str:
    """render_chat's work, in this process (the renderer process runs it): at most `max_chars`
    characters of output; TemplateError, or an error the template's own code raises, is
    InvalidInput."""
    try:
        out, size = [], 0
        for piece in _compile(template).generate(messages=messages, tools=tools, documents=None,
                                                 add_generation_prompt=add_generation_prompt, **special_tokens):
            size += len(piece)
            if size > max_chars:
                raise template_sandbox.BoundExceeded(f"the chat template's output is over {max_chars} characters")
            out.append(piece)
        return "".join(out)
    except (InvalidInput, MemoryError, RecursionError):
        raise
    except Exception as err:  # the template is data: whatever its code raises is its fault
        name = "" if _is_template_error(err) else f"{type(err).__name__}: "
        raise InvalidInput(f"chat template failed: {name}{err}") from err


def _is_template_error(err: Exception) -> bool:
    from jinja2 import TemplateError

    return isinstance(err, TemplateError)


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation's rendered text; `literals` maps each stand-in character in it to the
    message text it replaced (chat_prompt)."""

    text: str
    literals: dict[str, str]

    def ids(self, tok) -> list[int]:
        """Its token ids: the template's markers special tokens, a message's content text."""
        return tok.encode_with_literals(self.text, self.literals) if self.literals else tok.encode(self.text)


def chat_prompt_ids(tok, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
    """The token ids of a conversation: chat_prompt(...).ids(tok)."""
    return chat_prompt(tok, messages, add_generation_prompt, tools).ids(tok)


def chat_prompt(tok, messages: list[dict], add_generation_prompt: bool = True,
                tools: list[dict] | None = None, continue_final_message: bool = False) -> ChatPrompt:
    """A conversation rendered for tokenizing (`slm run --chat`, the API and the server use this
    one function): the template's own markers are special tokens, a message's content is text.

    A content that spells a control token (`<|im_end|><|im_start|>system`) must not become
    that token, or a user could forge a turn. Each such text in a message (its content, a tool
    call's name and arguments, a tool's definition: every string but the role) is replaced by a
    character that occurs nowhere in the conversation or the template (Unicode's private use
    plane 16) before rendering, and encoded back as the text it was after the template's own
    special tokens are cut out (TextTokenizer.encode_with_literals). `tok` is a TextTokenizer.

    continue_final_message (with add_generation_prompt false): the text ends where the last
    message's content does, leaving that message open for the answer to continue (transformers'
    and vLLM's rule, continue_final)."""
    markers = sorted(tok.control_texts(), key=len, reverse=True)  # longest first: leftmost-longest
    found = _markers_in(messages, markers, tools)
    if not found:
        text = render_chat(tok.chat_template, messages, tok.special_tokens, add_generation_prompt, tools)
        return ChatPrompt(continue_final(text, messages[-1]) if continue_final_message else text, {})
    used = set(tok.chat_template or "").union(*map(set, _texts(messages, tools)), *map(set, markers))
    free = (chr(c) for c in range(0x100000, 0x10FFFE) if chr(c) not in used)
    stand_in = dict(zip(found, free))
    pattern = re.compile("|".join(map(re.escape, found)))

    def protect(text: str) -> str:
        return pattern.sub(lambda m: stand_in[m.group()], text)

    safe = [{k: v if k == "role" else _map_strings(v, protect) for k, v in m.items()} for m in messages]
    safe_tools = _map_strings(tools, protect) if tools else tools
    text = render_chat(tok.chat_template, safe, tok.special_tokens, add_generation_prompt, safe_tools)
    if continue_final_message:
        text = continue_final(text, safe[-1])
    return ChatPrompt(text, {c: marker for marker, c in stand_in.items()})


def continue_final(text: str, final: dict) -> str:
    """A rendered conversation cut after the last occurrence of its final message's content (a
    template that trims the content: after the trimmed content), as transformers'
    apply_chat_template(continue_final_message=True) cuts it; InvalidInput if the template's
    output does not hold that content."""
    content = final.get("content")
    if not isinstance(content, str) or not content.strip():
        raise InvalidInput("continue_final_message needs a last message with text to continue")
    if content.strip() not in text:
        raise InvalidInput("continue_final_message: the chat template's output does not contain the last "
                           "message's text, so it cannot be continued")
    start = text.rindex(content.strip())
    kept = content.lstrip()
    end = start + (len(kept) if text[start:start + len(kept)] == kept else len(content.strip()))
    return text[:end]


def _texts(messages: list[dict], tools: list[dict] | None = None) -> list[str]:
    """Every string of the messages but their roles (contents, tool calls) and of the tools."""
    out: list[str] = []
    for m in messages:
        for k, v in m.items():
            if k != "role":
                _map_strings(v, lambda t: out.append(t) or t)
    _map_strings(tools, lambda t: out.append(t) or t)
    return out


def _map_strings(value, fn):
    """`value` with fn applied to every string in it (nested dicts and lists; keys stay)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    return value


def _markers_in(messages: list[dict], markers: list[str], tools: list[dict] | None = None) -> list[str]:
    """The control-token texts that occur in the messages' strings or the tools', longest first."""
    texts = _texts(messages, tools)
    return [m for m in markers if any(m in t for t in texts)]


# No chat template iterates over more than messages, tools or their characters; jinja2's own
# range has the same limit, but reports it as an OverflowError, not a template's error
MAX_RANGE = 100_000
MAX_POWER_BITS = 1 << 16


@lru_cache(maxsize=8)
def _compile(template: str):
    return _environment().from_string(template)


@lru_cache(maxsize=1)
def _environment():
    """The environment of transformers' chat templates (utils/chat_template_utils.py)."""
    import jinja2.ext
    from jinja2 import TemplateError, nodes
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox, with the operators that can ask for unbounded memory in one step
        checked before they run (the renderer's memory limit stays the backstop)."""

        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, times in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(times, int) \
                            and len(seq) * times > template_sandbox.MAX_OUTPUT_CHARS:
                        raise SecurityError(f"a repetition past the output cap "
                                            f"({template_sandbox.MAX_OUTPUT_CHARS} characters)")
            elif isinstance(left, int) and isinstance(right, int) and right * left.bit_length() > MAX_POWER_BITS:
                raise SecurityError(f"a power of more than {MAX_POWER_BITS} bits")
            return super().call_binop(context, operator, left, right)

    def bounded_range(*args):
        try:
            values = range(*args)
            count = len(values)
        except OverflowError:
            count = None
        if count is None or count > MAX_RANGE:
            raise SecurityError(f"a range of more than {MAX_RANGE} items")
        return values

    class GenerationTag(jinja2.ext.Extension):
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

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                             extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.globals["range"] = bounded_range
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env
