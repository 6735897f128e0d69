"""The two functions the tool-call tests offer a model (tests/serve/test_openai_tools.py and
test_openai_gemma_tools.py): their OpenAI `tools` and the schema each call's arguments must meet."""

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["paris", "oslo", "lima"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
CLOCK = {"type": "object", "additionalProperties": False, "required": ["zone"],
         "properties": {"zone": {"enum": ["utc", "cet"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": CLOCK}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
