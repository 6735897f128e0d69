"""Chat templates: slm's jinja2 sandbox renders a model's template exactly as transformers'
apply_chat_template does (the oracle), on Qwen2.5's and Qwen3's templates; the Gemma 3 fallback
renders what Google's template renders; the Gemma 3 chat prompt tokenizes as in llama.cpp.

The three templates below are test data, copied from the models' tokenizer_config.json files
(Qwen/Qwen2.5-*-Instruct, Qwen/Qwen3-4B, google/gemma-3-*-it) and compared against, never used
by slm.
"""

from __future__ import annotations

import pytest

from slm.errors import InvalidInput
from slm.model.chat import GEMMA3_TEMPLATE, fallback_template, render_chat
from tokenizer_corpus import LlamaCppVocab, gemma3_gguf, slm_tokenizer

QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<think>\n' }}
{%- endif %}"""

GEMMA3_GOOGLE_TEMPLATE = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}"""

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  Hi!\n"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "Sure? <end_of_turn> {{ not a tag }}"}],
    [{"role": "system", "content": "Reason first."}, {"role": "user", "content": "Why?"},
     {"role": "assistant", "content": "<think>\nbecause\n</think>\n\nBecause."},
     {"role": "user", "content": "日本語で 👍🏽", "name": None}],
]
SPECIAL = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}


def transformers_render(template: str, messages: list[dict], add_generation_prompt: bool) -> str:
    """transformers' apply_chat_template(tokenize=False) on a tokenizer with SPECIAL."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<unk>", *SPECIAL.values()])}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
                                  unk_token="<unk>", **SPECIAL)
    return tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                   add_generation_prompt=add_generation_prompt)


def slm_render(template: str, messages: list[dict], add_generation_prompt: bool) -> str:
    return render_chat(template, messages, {**SPECIAL, "unk_token": "<unk>"}, add_generation_prompt)


@pytest.mark.oracle
@pytest.mark.parametrize("template", [QWEN25_TEMPLATE, QWEN3_TEMPLATE], ids=["qwen2.5", "qwen3"])
@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_qwen_templates_render_as_in_transformers(template, messages, add_generation_prompt):
    want = transformers_render(template, messages, add_generation_prompt)
    assert slm_render(template, messages, add_generation_prompt) == want


@pytest.mark.oracle
@pytest.mark.parametrize("messages", [
    *CONVERSATIONS[:3],
    [{"role": "system", "content": [{"type": "text", "text": "Be brief. "}]},
     {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe it. "}]}],
])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gemma3_fallback_renders_as_googles_template(messages, add_generation_prompt):
    want = transformers_render(GEMMA3_GOOGLE_TEMPLATE, messages, add_generation_prompt)
    assert slm_render(GEMMA3_TEMPLATE, messages, add_generation_prompt) == want


def test_gemma3_fallback_turn_format():
    """The format itself, as Gemma 3's model card spells it."""
    text = slm_render(GEMMA3_TEMPLATE, CONVERSATIONS[1], True)
    assert text == "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n<start_of_turn>model\n"


def test_gemma3_fallback_rejects_what_googles_template_rejects():
    with pytest.raises(InvalidInput, match="roles must alternate"):
        slm_render(GEMMA3_TEMPLATE, [{"role": "assistant", "content": "hi"}], True)
    with pytest.raises(InvalidInput, match="Invalid content type"):
        slm_render(GEMMA3_TEMPLATE, [{"role": "user", "content": 3}], True)


def test_fallback_chosen_by_architecture():
    assert fallback_template("gemma3") == GEMMA3_TEMPLATE
    assert fallback_template("llama") is None and fallback_template(None) is None


@pytest.mark.parametrize("template, message", [
    (None, "no chat template"),
    ("{{ raise_exception('bad conversation') }}", "bad conversation"),
    ("{% for %}", "chat template failed"),
    ("{{ ''.__class__.__mro__ }}", "chat template failed"),  # the sandbox refuses
    ("{{ messages.append(1) }}", "chat template failed"),  # immutable
])
def test_template_failures_are_one_line_errors(template, message):
    with pytest.raises(InvalidInput, match=message) as err:
        slm_render(template, CONVERSATIONS[0], True)
    assert "\n" not in str(err.value)


def test_transformers_conventions():
    """tojson without HTML escaping, {% break %}, {% generation %}, strftime_now, keys whose value
    is None dropped, and special tokens the vocabulary lacks left undefined."""
    template = ("{{ messages[0].content | tojson }}{% for m in messages %}{% break %}{% endfor %}"
                "{% generation %}[{{ messages[0].name is defined }}]{% endgeneration %}"
                "{{ strftime_now('%Y') | length }}{{ pad_token is defined }}")
    out = render_chat(template, [{"role": "user", "content": "<a & 'b'>", "name": None}], {}, True)
    assert out == "\"<a & 'b'>\"[False]4False"


@pytest.mark.real_model
@pytest.mark.oracle
def test_gemma3_chat_prompt_tokenizes_as_llama_cpp():
    """llama.cpp's chat code strips the template's leading <bos> and tokenizes with add_bos and
    special tokens; slm keeps the text and adds no second BOS: the same ids."""
    pytest.importorskip("llama_cpp")
    path = gemma3_gguf()
    tok, _ = slm_tokenizer(path)
    ref = LlamaCppVocab(path)
    for messages in CONVERSATIONS:
        text = render_chat(tok.chat_template, messages, tok.special_tokens)
        assert text.startswith("<bos><start_of_turn>")
        ids = tok.encode(text)
        assert ids == ref.tokenize(text[len("<bos>"):], True, True)
        assert ids[:2] == [tok.bos_id, 105] and ids.count(tok.bos_id) == 1
    assert 106 in tok.eos_ids  # <end_of_turn> ends the model's turn
