"""The two functions the tool-call tests offer a model (tests/serve/test_openai_tools.py,
test_openai_gemma_tools.py and test_run_serve_parity.py): their OpenAI `tools` and the schema
each call's arguments must meet; and the tiny model given a chat template with tools."""

import json
import shutil

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["paris", "oslo", "lima"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
CLOCK = {"type": "object", "additionalProperties": False, "required": ["zone"],
         "properties": {"zone": {"enum": ["utc", "cet"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": CLOCK}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}


def tool_model(root, tiny_model: dict, template: str, name: str):
    """A copy of the tiny model's Hugging Face directory (root/name) with this chat template and
    a context of 2048 positions: room for the tools in the prompt (random weights: any length)."""
    hf = shutil.copytree(tiny_model["hf"], root / name)
    config = json.loads((hf / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (hf / "tokenizer_config.json").write_text(json.dumps(config))
    model_config = json.loads((hf / "config.json").read_text())
    model_config["max_position_embeddings"] = 2048
    (hf / "config.json").write_text(json.dumps(model_config))
    return hf
