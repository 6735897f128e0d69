"""Discovery on a real `slm serve`: /v1/models lists every base and composition the store
names (with the store's commit times), GET /v1/models/{id}, the openai client's
models.list(), and llama-server's /tokenize and /detokenize."""

from __future__ import annotations

import time

import pytest

from helpers import copy_store, tiny_store
from serve_helpers import Server

pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """tq with a1 and a2; tq+a1@0.5 stored (activated once), then tq+a2@0.8 active; the
    tag prod names tq+a1@0.5, the tag plain the base alone."""
    return tiny_store(tmp_path_factory.mktemp("disc"), tiny_model, adapters=2,
                      steps=(("activate", "tq", "a1@0.5"), ("activate", "tq", "a2@0.8"),
                             ("tag", "prod", "tq+a1@0.5"), ("tag", "plain", "tq")))


@pytest.fixture
def server(template, tmp_path):
    srv = Server(copy_store(template, tmp_path), "--threads", "1")
    yield srv
    assert srv.stop() == 0


def test_models_lists_every_base_and_composition_with_created(server):
    code, doc = server.json("GET", "/v1/models")
    assert code == 200 and doc["object"] == "list"
    by_id = {m["id"]: m for m in doc["data"]}
    assert doc["data"][0]["id"] == "active"
    assert {"tq", "tq+a1@0.5", "tq+a2@0.8"} <= set(by_id)
    now = time.time()
    for m in doc["data"]:
        assert m["object"] == "model" and m["owned_by"] == "slm"
        assert now - 3600 < m["created"] <= now + 1, m  # a real time: when the store committed it
    assert by_id["tq"]["slm"]["kind"] == "base"
    comp = by_id["tq+a2@0.8"]["slm"]
    assert comp["base"] == "tq" and [(a["name"], a["weight"]) for a in comp["adapters"]] == [("a2", 0.8)]
    assert comp["active"] and not by_id["tq+a1@0.5"]["slm"]["active"]
    assert by_id["active"]["slm"]["composition"] == comp["composition"]
    assert by_id["active"]["created"] == by_id["tq+a2@0.8"]["created"]


def test_models_lists_every_name_a_request_accepts_once_with_its_lineage(server):
    """Tags are listed (a request's `model` takes them), each id once, vLLM's root and parent
    (the base), and a composition a request staged by its spec is listed by that spec, created
    when the last of its names was committed."""
    code, out = server.json("POST", "/v1/completions", {"model": "tq+a1@0.25", "prompt": "hi", "max_tokens": 1})
    assert code == 200
    data = server.json("GET", "/v1/models")[1]["data"]
    ids = [m["id"] for m in data]
    assert len(ids) == len(set(ids)), ids
    assert set(ids) == {"active", "prod", "plain", "tq", "tq+a1@0.5", "tq+a2@0.8", "tq+a1@0.25"}
    by_id = {m["id"]: m for m in data}
    assert (by_id["tq"]["root"], by_id["tq"]["parent"]) == ("tq", None)
    for model_id in ("active", "prod", "tq+a1@0.5", "tq+a2@0.8", "tq+a1@0.25"):
        assert (by_id[model_id]["root"], by_id[model_id]["parent"]) == ("tq", "tq"), model_id
    assert (by_id["plain"]["root"], by_id["plain"]["parent"]) == ("tq", None)  # the base alone
    assert by_id["prod"]["slm"]["kind"] == "tag"
    assert by_id["prod"]["slm"]["composition"] == by_id["tq+a1@0.5"]["slm"]["composition"]
    assert by_id["plain"]["slm"]["composition"] == by_id["tq"]["slm"]["composition"] is not None
    assert by_id["tq+a1@0.25"]["slm"]["composition"] == out["system_fingerprint"]
    assert 0 < by_id["tq"]["created"] <= by_id["tq+a1@0.25"]["created"] <= by_id["prod"]["created"]
    for model_id in ids:  # every listed id runs, on the composition listed for it
        code, hdrs, _ = server.http("POST", "/v1/completions", {"model": model_id, "prompt": "hi", "max_tokens": 1})
        assert code == 200 and hdrs["slm-composition"] == by_id[model_id]["slm"]["composition"], model_id
    # one a request could name, not listed: its composition's entry, or one under that spec
    comp = by_id["tq+a1@0.5"]["slm"]["composition"]
    assert server.json("GET", f"/v1/models/{comp[:19]}")[1]["slm"]["composition"] == comp
    code, m = server.json("GET", "/v1/models/tq+a2@0.125")
    assert code == 200 and (m["id"], m["parent"], m["slm"]["composition"] is not None) == ("tq+a2@0.125", "tq", True)


def test_listed_ids_are_what_requests_name(server):
    client = server.client()
    listed = [m.id for m in client.models.list()]  # what a UI fills its model menu from
    assert "tq+a1@0.5" in listed and "tq" in listed
    for model in ("tq+a1@0.5", "tq"):
        out = client.completions.create(model=model, prompt="the cat", max_tokens=3)
        assert out.choices[0].text is not None
    code, hdrs, _ = server.http("POST", "/v1/completions", {"model": "tq+a1@0.5", "prompt": "hi", "max_tokens": 1})
    assert code == 200 and hdrs["slm-composition"] == server.json("GET", "/v1/models/tq+a1@0.5")[1]["slm"]["composition"]


def test_get_one_model_and_404_for_unknown(server):
    code, m = server.json("GET", "/v1/models/tq")
    assert code == 200 and m["id"] == "tq" and m["slm"]["kind"] == "base"
    code, m = server.json("GET", "/v1/models/active")
    assert code == 200 and m["slm"]["active"]
    code, err = server.json("GET", "/v1/models/nope")
    assert code == 404 and "nope" in err["error"]["message"]
    assert server.client().models.retrieve("tq+a2@0.8").id == "tq+a2@0.8"


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
                                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})])
def test_an_unknown_model_is_a_404_model_not_found_and_bad_syntax_a_400(server, path, body):
    """OpenAI's and vLLM's answer to a model nobody serves (a router tells it from a bad request)."""
    for model in ("nope", "tq+nope@0.5"):  # no such name; a spec naming an adapter the store lacks
        code, err = server.json("POST", path, {**body, "model": model})
        assert code == 404 and err["error"]["code"] == "model_not_found", (model, err)
        assert err["error"]["type"] == "invalid_request_error" and "nope" in err["error"]["message"]
    for model in ("tq++a1", "tq+a1@abc"):  # not a spec at all
        code, err = server.json("POST", path, {**body, "model": model})
        assert code == 400 and err["error"]["code"] is None, (model, err)
    import openai
    with pytest.raises(openai.NotFoundError):
        server.client().completions.create(model="nope", prompt="hi", max_tokens=1)


def test_tokenize_detokenize_round_trip(server):
    text = "the cat sat on the mat, café"
    code, doc = server.json("POST", "/tokenize", {"content": text})
    assert code == 200 and all(isinstance(t, int) for t in doc["tokens"]) and len(doc["tokens"]) > 3
    code, back = server.json("POST", "/detokenize", {"tokens": doc["tokens"]})
    assert code == 200 and back["content"] == text
    code, pieces = server.json("POST", "/tokenize", {"content": text, "with_pieces": True})
    assert [p["id"] for p in pieces["tokens"]] == doc["tokens"]
    # a piece is text, or its byte values when it holds part of a character (llama-server's shape)
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                      for p in pieces["tokens"])
    assert joined.decode() == text and any(isinstance(p["piece"], list) for p in pieces["tokens"])
    code, special = server.json("POST", "/tokenize", {"content": text, "add_special": True, "model": "tq"})
    assert code == 200 and special["tokens"][-len(doc["tokens"]):] == doc["tokens"]


def test_tokenize_refuses_bad_bodies(server):
    for path, body, word in (("/tokenize", {"content": 3}, "content"), ("/detokenize", {"tokens": ["a"]}, "tokens"),
                             ("/detokenize", {"tokens": [10 ** 9]}, "token ids")):
        code, err = server.json("POST", path, body)
        assert code == 400 and word in err["error"]["message"], (path, body, err)
    code, err = server.json("POST", "/tokenize", {"content": "x", "model": "nope"})
    assert code == 404 and err["error"]["code"] == "model_not_found" and "nope" in err["error"]["message"]
    code, _, _ = server.http("POST", "/tokenize", b"x" * (2 << 20))
    assert code == 413
