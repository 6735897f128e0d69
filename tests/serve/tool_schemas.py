"""The two functions the tool-call tests offer a model (tests/serve/test_openai_tools.py,
test_openai_gemma_tools.py and test_run_serve_parity.py): their OpenAI `tools` and the schema each call's arguments must meet;
the Qwen-style chat template those tests give the tiny model, and the tiny model's HF directory
with a chat template of the test's and room for the tools in its context."""

import json
import shutil
from pathlib import Path

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["paris", "oslo", "lima"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
CLOCK = {"type": "object", "additionalProperties": False, "required": ["zone"],
         "properties": {"zone": {"enum": ["utc", "cet"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": CLOCK}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}

# The shape of Qwen 2.5's tool template (tools listed in the system turn, calls as JSON between
# <tool_call> lines, results in <tool_response> blocks of a user turn), written for the test.
QWEN_STYLE_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call functions. Their signatures are within <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each call, return {\"name\": ..., \"arguments\": ...} within <tool_call></tool_call> tags.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls %}{%- set call = call.function %}
{{- '\\n<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' + (call.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def tiny_hf_with_template(tiny_model: dict, folder: Path, chat_template: str) -> Path:
    """A copy of the tiny model's HF directory at `folder` whose tokenizer carries
    `chat_template`, with a context of 2048 positions (room for the tools in the prompt; its
    weights are random, so any length is as good)."""
    hf = Path(shutil.copytree(tiny_model["hf"], folder))
    config = json.loads((hf / "tokenizer_config.json").read_text())
    config["chat_template"] = chat_template
    (hf / "tokenizer_config.json").write_text(json.dumps(config))
    model_config = json.loads((hf / "config.json").read_text())
    model_config["max_position_embeddings"] = 2048
    (hf / "config.json").write_text(json.dumps(model_config))
    return hf
