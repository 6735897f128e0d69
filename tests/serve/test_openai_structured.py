"""Structured output on a real `slm serve` with the real openai client: response_format
json_schema (strict: nested objects, enums, arrays) and json_object, chat and completions,
streamed and not. The tiny model's weights are random, so only the grammar can make its
answers valid JSON: every answer that ends with "stop" must parse and validate."""

from __future__ import annotations

import json
import threading

import pytest

from helpers import copy_store, tiny_store
from serve_helpers import Server

pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "color": {"enum": ["red", "green", "blue"]},
        "sizes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "maxItems": 3},
        "owner": {"type": "object",
                  "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["cat", "dog"]}},
                  "required": ["ok", "kind"], "additionalProperties": False},
    },
    "required": ["name", "color", "sizes", "owner"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("structured"), tiny_model)


@pytest.fixture
def server(template, tmp_path):
    srv = Server(copy_store(template, tmp_path), "--threads", "1", "--max-batch", "4")
    yield srv
    assert srv.stop() == 0


def _valid(text: str) -> dict:
    doc = json.loads(text)
    jsonschema.validate(doc, SCHEMA)
    return doc


def test_json_schema_answers_parse_and_validate_chat_and_completions(server):
    client = server.client()
    for seed in range(4):
        temperature = 0.0 if seed == 0 else 1.0
        chat = client.chat.completions.create(
            model="active", messages=[{"role": "user", "content": "describe a pet"}], max_tokens=MAX_TOKENS,
            temperature=temperature, seed=seed, response_format=FORMAT)
        assert chat.choices[0].finish_reason == "stop"
        _valid(chat.choices[0].message.content)
        done = client.completions.create(model="active", prompt="the cat sat on", max_tokens=MAX_TOKENS,
                                         temperature=temperature, seed=seed, extra_body={"response_format": FORMAT})
        assert done.choices[0].finish_reason == "stop"
        _valid(done.choices[0].text)


def test_json_schema_streamed_equals_whole_answer(server):
    client = server.client()
    messages = [{"role": "user", "content": "hello there"}]
    whole = client.chat.completions.create(model="active", messages=messages, max_tokens=MAX_TOKENS,
                                           response_format=FORMAT).choices[0].message.content
    pieces, reasons = [], []
    for part in client.chat.completions.create(model="active", messages=messages, max_tokens=MAX_TOKENS,
                                               response_format=FORMAT, stream=True):
        if part.choices:
            pieces.append(part.choices[0].delta.content or "")
            reasons.append(part.choices[0].finish_reason)
    assert "".join(pieces) == whole and reasons[-1] == "stop"
    _valid(whole)


def test_free_answers_are_not_json_and_json_object_is_an_object(server):
    """Without response_format the random model's text is not JSON; with json_object every
    answer is a JSON object: one the grammar let end (finish_reason "stop"), or one its budget
    would have cut, closed to fit max_tokens (finish_reason "length": a random model mostly
    runs out of tokens inside a string)."""
    client = server.client()
    free = client.completions.create(model="active", prompt="the cat", max_tokens=24).choices[0].text
    with pytest.raises(json.JSONDecodeError):
        json.loads(free)
    reasons = []
    for seed in range(6):
        out = client.completions.create(model="active", prompt="the cat", max_tokens=40, temperature=1.0,
                                        seed=seed, extra_body={"response_format": {"type": "json_object"}})
        choice = out.choices[0]
        assert isinstance(json.loads(choice.text), dict), choice.text
        assert out.usage.completion_tokens <= 40
        reasons.append(choice.finish_reason)
    assert set(reasons) <= {"stop", "length"} and "stop" in reasons, reasons


def test_uncompilable_or_malformed_response_format_is_400(server):
    import openai

    client = server.client()
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="active", messages=[{"role": "user", "content": "hi"}],
                                       response_format=bad_schema)
    message = err.value.body["message"]
    assert "cannot be compiled" in message and "look-around" in message  # the engine's reason
    for fmt, word in (({"type": "yaml"}, "response_format.type"), ("json", "response_format"),
                      ({"type": "json_schema"}, "json_schema"),
                      ({"type": "json_schema", "json_schema": {"schema": [1]}}, "schema")):
        code, body = server.json("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "response_format": fmt})
        assert code == 400 and word in body["error"]["message"], (fmt, body)
    nested: dict = {"type": "string"}
    for _ in range(300):
        nested = {"type": "object", "properties": {"a": nested}, "required": ["a"]}
    for schema, word in (({"type": "frob"}, "frob"), ({"allOf": [{"type": "string"}, {"type": "integer"}]},
                                                      "Unsatisfiable"), (nested, "recursion")):
        code, body = server.json("POST", "/v1/completions", {"prompt": "hi", "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
        message = body["error"]["message"]
        assert code == 400 and "cannot be compiled" in message and word in message and "\n" not in message
    assert server.status()["staged"]  # the server still serves
    out = client.completions.create(model="active", prompt="hi", max_tokens=2)
    assert out.choices[0].finish_reason == "length"


def test_constrained_and_free_rows_in_one_batch_keep_their_own_answers(server):
    """Greedy answers alone, then the same requests at once (decoded in shared steps): the free
    rows' texts are their texts alone, the constrained rows' theirs (no mask leaks across rows)."""
    client = server.client()
    jobs = [("the cat sat on", None), ("hello there", FORMAT), ("one two three", None), ("a b c d e", FORMAT)]

    def ask(prompt, fmt):
        extra = {"response_format": fmt} if fmt else {}
        return client.completions.create(model="active", prompt=prompt, max_tokens=MAX_TOKENS, extra_body=extra).choices[0].text

    alone = [ask(p, f) for p, f in jobs]
    for (_, fmt), text in zip(jobs, alone):
        if fmt:
            _valid(text)
    together: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i, j=j: together.__setitem__(i, ask(*j))) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [together[i] for i in range(len(jobs))] == alone
    _, _, metrics = server.http("GET", "/metrics")
    rows = {line.split('le="')[1].split('"')[0]: float(line.split()[-1])
            for line in metrics.decode().splitlines() if line.startswith("slm_batch_rows_bucket")}
    assert rows["+Inf"] > rows["1.0"], f"no decode step ran more than one row: {rows}"


def test_session_generate_and_slm_run_json_schema_share_the_grammar(template, tmp_path, cli):
    """Session.generate(response_format=...) and `slm run --json-schema FILE` give the server's
    greedy answer (one implementation, three doors); a schema file that is not JSON is refused."""
    import slm

    store_dir = copy_store(template, tmp_path)
    session = slm.Runtime(slm.Store.open(store_dir)).session()
    api = session.generate("the cat sat on", max_tokens=MAX_TOKENS, response_format=FORMAT)
    assert api.stop_reason == "eos"
    _valid(api.text)
    schema_file = tmp_path / "thing.json"
    schema_file.write_text(json.dumps(SCHEMA))
    r = cli("--store", str(store_dir), "run", "the cat sat on", "-n", str(MAX_TOKENS), "--json-schema",
            str(schema_file), "--json")
    assert r.code == 0, r.err
    assert r.json()["text"] == api.text
    (tmp_path / "bad.json").write_text("{not json")
    r = cli("--store", str(store_dir), "run", "hi", "--json-schema", str(tmp_path / "bad.json"))
    assert r.code == int(slm.ExitCode.INVALID_INPUT) and "--json-schema" in r.err and "not JSON" in r.err
    srv = Server(store_dir, "--threads", "1")
    try:
        served = srv.client().completions.create(model="active", prompt="the cat sat on", max_tokens=MAX_TOKENS,
                                                 extra_body={"response_format": FORMAT}).choices[0].text
    finally:
        assert srv.stop() == 0
    assert served == api.text


REAL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "owner": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120},
                                                   "kind": {"enum": ["cat", "dog"]}},
                  "required": ["age", "kind"], "additionalProperties": False},
    },
    "required": ["name", "color", "tags", "owner"],
    "additionalProperties": False,
}


@pytest.mark.real_model
def test_smollm2_twenty_of_twenty_validate_chat_and_completions_streamed_and_not(cli, store, store_dir,
                                                                                smollm2_gguf):
    assert cli("import", "base", smollm2_gguf, "--name", "smol").code == 0
    assert cli("activate", "smol").code == 0
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": REAL_SCHEMA, "strict": True}}
    server = Server(store_dir, "--threads", "1")
    answers = []
    try:
        client = server.client()
        for seed in range(20):
            kind = ("chat", "completion")[seed % 2]
            stream = seed % 4 >= 2
            common = dict(model="active", max_tokens=120, temperature=1.0, seed=seed, stream=stream)
            if kind == "chat":
                out = client.chat.completions.create(
                    messages=[{"role": "user", "content": "Describe a pet as JSON."}], response_format=fmt, **common)
            else:
                out = client.completions.create(prompt="A pet, as JSON:", extra_body={"response_format": fmt},
                                                **common)
            if stream:
                parts = [p for p in out if p.choices]
                text = "".join((p.choices[0].delta.content or "") if kind == "chat" else p.choices[0].text
                               for p in parts)
                reason = parts[-1].choices[0].finish_reason
            else:
                text = out.choices[0].message.content if kind == "chat" else out.choices[0].text
                reason = out.choices[0].finish_reason
            answers.append((kind, stream, reason, text))
    finally:
        assert server.stop() == 0
    for kind, stream, reason, text in answers:
        assert reason == "stop", (kind, stream, text)
        jsonschema.validate(json.loads(text), REAL_SCHEMA)
    assert len(answers) == 20
