"""The server's details a third outside attack found loose (issue 45): a 401 told the active
composition's id to a client without the key; two Authorization headers passed when the second
was right; unknown keys inside response_format, tool definitions and /tokenize bodies passed
unnoticed; tool names were not checked; /v1/models listed a base twice, the active base as
inactive. One real server with an API key, on the tiny base `tq` (active) and tq + a1."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import pytest

from helpers import copy_store, one_line, tiny_store
from serve_helpers import Server

pytest.importorskip("uvicorn")
pytestmark = pytest.mark.hostile

KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("details")
    template = tiny_store(root / "template", tiny_model, adapters=1,
                          steps=(("activate", "tq", "a1@0.5"), ("activate", "tq")))
    srv = Server(copy_store(template, root), "--threads", "1", "--api-key", KEY)
    yield srv
    assert srv.stop() == 0


def _raw(server, path: str, auths: list[str], body: dict | None = None) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of a request carrying each of `auths` as its own header."""
    url = urlparse(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.putrequest("POST" if body is not None else "GET", path)
        for auth in auths:
            conn.putheader("Authorization", auth)
        data = json.dumps(body).encode() if body is not None else b""
        if body is not None:
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data or None)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())
    finally:
        conn.close()


def test_a_401_does_not_tell_the_active_composition(server):
    active = server.json("GET", "/v1/slm/status", headers=AUTH)[1]["active"]["id"]
    code, headers, _ = server.http("GET", "/v1/models", headers=AUTH)
    assert code == 200 and headers["slm-composition"] == active  # with the key: told
    for headers_sent in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + KEY}):
        code, headers, body = server.http("GET", "/v1/models", headers=headers_sent)
        assert code == 401, headers_sent
        assert headers.get("slm-composition", "") == "" and active not in json.dumps(headers), headers
        assert active not in body.decode()


@pytest.mark.parametrize("auths", [[f"Bearer {KEY}", f"Bearer {KEY}"], ["Bearer wrong", f"Bearer {KEY}"],
                                   [f"Bearer {KEY}", "Bearer wrong"]])
def test_two_authorization_headers_are_refused_whichever_is_right(server, auths):
    code, headers, body = _raw(server, "/v1/models", auths)
    assert code == 401 and "one Authorization header" in body["error"]["message"]
    assert headers.get("slm-composition", "") == ""
    assert _raw(server, "/v1/models", [f"Bearer {KEY}"])[0] == 200


FORMAT = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"prompt": "hi", "response_format": {**FORMAT, "schema": {"type": "object"}}},
     "response_format.schema"),
    ("/v1/completions", {"prompt": "hi", "response_format": {"type": "json_object", "strictly": True}},
     "response_format.strictly"),
    ("/v1/completions", {"prompt": "hi", "response_format": {
        "type": "json_schema", "json_schema": {**FORMAT["json_schema"], "schemas": {}}}},
     "response_format.json_schema.schemas"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{**TOOL, "strict": True}]},
     "tools[0].strict"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {**TOOL["function"], "parameter": {}}}]}, "tools[0].function.parameter"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "get_time", "arguments": "{}"}}}, "tool_choice.function.arguments"),
    ("/tokenize", {"content": "hi", "add_specials": True}, "add_specials"),
    ("/detokenize", {"tokens": [1, 2], "content": "x"}, "content"),
])
def test_an_unknown_key_inside_a_body_is_a_400_naming_it(server, path, body, field):
    code, err = server.json("POST", path, body, headers=AUTH)
    assert code == 400, err
    message = err["error"]["message"]
    assert one_line(message) and f"unknown field: {field}" in message, message


@pytest.mark.parametrize("name", ["get time", "get.time", "", "x" * 65, "télé", "a/b"])
def test_a_tool_name_outside_openais_rule_is_a_400(server, name):
    body = {"messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]}
    code, err = server.json("POST", "/v1/chat/completions", body, headers=AUTH)
    assert code == 400 and "tools[0]" in err["error"]["message"], err


def test_tool_names_within_the_rule_pass_the_check():
    from slm.api import Tools

    for name in ("get_time", "x" * 64, "A-b_9"):
        tools = Tools.of([{"type": "function", "function": {"name": name, "description": "d", "strict": True}}])
        assert [d["function"]["name"] for d in tools.definitions] == [name]


def test_models_lists_each_id_once_and_the_active_base_as_active(server):
    active = server.json("GET", "/v1/slm/status", headers=AUTH)[1]["active"]["id"]
    code, doc = server.json("GET", "/v1/models", headers=AUTH)
    assert code == 200
    ids = [m["id"] for m in doc["data"]]
    assert len(ids) == len(set(ids)), ids
    by_id = {m["id"]: m for m in doc["data"]}
    assert {"active", "tq", "tq+a1@0.5"} <= set(by_id)
    base = by_id["tq"]["slm"]
    assert base["kind"] == "base" and base["active"] and base["composition"] == active
    assert not by_id["tq+a1@0.5"]["slm"]["active"]
    assert [m["id"] for m in doc["data"] if m["slm"]["active"]] == ["active", "tq"]
