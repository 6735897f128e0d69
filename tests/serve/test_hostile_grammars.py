"""Grammars on a real `slm serve`: a schema that derives no finite document is refused up front
(400), as response_format and as the parameters of a forced tool call, where it used to be
answered with "" or `{"` and finish_reason "stop"; and tool parameters whose `$ref`s point into
their own `$defs` (the form Pydantic and the openai SDK emit) are constrained as they are under
response_format, where they used to be refused."""

from __future__ import annotations

import json

import pytest

from helpers import copy_store, tiny_store
from serve_helpers import Server
from tool_schemas import QWEN_STYLE_TEMPLATE, tiny_hf_with_template

pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")

ASK = [{"role": "user", "content": "where is the parcel?"}]
# each accepts no finite JSON document: every valid instance would contain itself
UNSATISFIABLE = {
    "self": {"$ref": "#"},
    "cycle": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "required recursion": {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]},
}


class Place(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")  # (as the openai SDK's strict schemas: no other keys)
    city: str = pydantic.Field(max_length=12)
    zone: int = pydantic.Field(ge=0, le=9)


class Parcel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    origin: Place
    destination: Place


PARCEL = Parcel.model_json_schema()  # {"$defs": {"Place": ...}, "properties": {"origin": {"$ref": "#/$defs/Place"}, ...}}


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("grammars")
    hf = tiny_hf_with_template(tiny_model, root / "hf-tools", QWEN_STYLE_TEMPLATE)
    return tiny_store(root, tiny_model, bases={}, steps=(("import", "base", hf, "--name", "qt"), ("activate", "qt")))


@pytest.fixture(scope="module")
def server(template, tmp_path_factory):
    srv = Server(copy_store(template, tmp_path_factory.mktemp("grammars-serve")), "--threads", "1")
    yield srv
    assert srv.stop() == 0


def _tool(parameters: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "track", "description": "Track a parcel", "parameters": parameters}}]


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.mark.hostile
@pytest.mark.parametrize("case", sorted(UNSATISFIABLE))
def test_a_schema_with_no_finite_document_is_refused_before_generation(server, case):
    schema = UNSATISFIABLE[case]
    asks = {"response_format": {"response_format": _format(schema)},
            "forced tool": {"tools": _tool(schema), "tool_choice": "required"}}
    for door, fields in asks.items():
        status, body = server.json("POST", "/v1/chat/completions",
                                   {"model": "qt", "messages": ASK, "max_tokens": 8, **fields})
        assert status == 400, (door, status, body)
        assert "accepts no finite JSON document" in body["error"]["message"], (door, body)
    completion = {"model": "qt", "prompt": "the parcel", "max_tokens": 8, "response_format": _format(schema)}
    status, body = server.json("POST", "/v1/completions", completion)
    assert status == 400, body


@pytest.mark.hostile
def test_pydantic_defs_constrain_forced_tool_arguments_as_they_do_a_response_format(server):
    client = server.client()
    out = client.chat.completions.create(model="qt", messages=ASK, tools=_tool(PARCEL), tool_choice="required",
                                         parallel_tool_calls=False, max_tokens=300, temperature=1.0, seed=3)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "track"
    jsonschema.validate(json.loads(call.function.arguments), PARCEL)
    answer = client.chat.completions.create(model="qt", messages=ASK, response_format=_format(PARCEL),
                                            max_tokens=300, temperature=1.0, seed=3).choices[0]
    assert answer.finish_reason == "stop", answer
    jsonschema.validate(json.loads(answer.message.content), PARCEL)
