"""Three `slm serve` replicas behind vLLM's router (vllm-router, pinned in the dev extra), one
router per policy on the same replicas: the real openai client's chat and completions, streamed
and not, on compositions named per request, n=2 and json_schema, all succeed through the
router, and each answer equals the same request sent straight to a replica (greedy, or sampled
with a seed: a request's text depends on its seed and composition alone, never on which
replica or batch ran it). The replicas pulled the compositions signed and refuse unsigned ones
(fleet_fixtures.py); the router passes that refusal on."""

from __future__ import annotations

import json

import pytest

from fleet_fixtures import fleet, openai_client  # noqa: F401  (fixture)
from router_peer import POLICIES

jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.real_model, pytest.mark.slow]

QUESTION = "What is the capital of France?"
PROMPT = "The capital of France is"
MAX_TOKENS = 12
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
          "required": ["city"], "additionalProperties": False}
# what vllm-router's cache_aware policy asks a replica before it routes a request
TOKEN_ENDPOINTS = ("/v1/chat/completions/render", "/v1/completions/render", "/tokenize")
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}


def _models(fleet) -> dict[str, str]:  # noqa: F811
    """What a request may name in `model` -> the composition that must run it (its tag)."""
    pub = fleet.published
    return {"active": "pirate", pub.pinned["pirate"]: "pirate", pub.ids["french"]: "french",
            pub.refs["base"]: "base",
            "smollm2+french@0.6": "french"}  # a spec of the signed composition is that composition


def _streamed(chunks, piece) -> tuple[list[str], str]:
    """(the choices' texts, system_fingerprint) of a stream: every choice ended with a
    finish_reason, every chunk named the same composition. piece: a choice's text in a chunk."""
    texts: dict[int, str] = {}
    fingerprints, finished = set(), set()
    for chunk in chunks:
        fingerprints.add(chunk.system_fingerprint)
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + piece(c)
            if c.finish_reason:
                finished.add(c.index)
    assert finished == set(texts) and len(fingerprints) == 1, (finished, fingerprints)
    return [texts[i] for i in sorted(texts)], fingerprints.pop()


def _chat(client, model: str, stream: bool, max_tokens: int = MAX_TOKENS, **extra) -> tuple[list[str], str]:
    """(the choices' texts, system_fingerprint) of one chat request, streamed or whole."""
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=max_tokens, stream=stream, **extra)
    if stream:
        return _streamed(reply, lambda c: c.delta.content or "")
    return [c.message.content for c in reply.choices], reply.system_fingerprint


def _completion(client, model: str, stream: bool, max_tokens: int = MAX_TOKENS, **extra) -> tuple[list[str], str]:
    """The same for one completion of PROMPT."""
    reply = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens, stream=stream, **extra)
    if stream:
        return _streamed(reply, lambda c: c.text)
    return [c.text for c in reply.choices], reply.system_fingerprint


ASK = {"chat": _chat, "completion": _completion}


@pytest.fixture(scope="module")
def direct(fleet):  # noqa: F811
    """The answers of one replica asked directly, per (endpoint, model): the reference."""
    client = openai_client(fleet.replicas[0].url)
    return {(kind, model): ask(client, model, False) for kind, ask in ASK.items() for model in _models(fleet)}


@pytest.fixture(scope="module", params=POLICIES)
def router(request, fleet):  # noqa: F811
    router = fleet.router(request.param)
    yield router
    router.stop()


def test_chat_and_completions_through_the_router_equal_a_direct_request(fleet, direct, router):  # noqa: F811
    """Greedy, on five names of compositions, streamed and not: the text a replica gives when
    asked directly, and the composition the name stands for (system_fingerprint)."""
    client = openai_client(router.url)
    ids = fleet.published.ids
    before = [r.requests_served() for r in fleet.replicas]
    for (kind, model), expected in direct.items():
        assert expected[1] == ids[_models(fleet)[model]], (model, expected)
        for stream in (False, True):
            got = ASK[kind](client, model, stream)
            assert got == expected, (router.policy, kind, model, stream)
            assert got[0][0].strip(), (kind, model)  # a real answer, not an empty one
    spread = [r.requests_served() - b for r, b in zip(fleet.replicas, before)]
    print(f"{router.policy}: requests per replica {spread}")
    assert sum(spread) == 2 * len(direct)  # each through the router reached one replica, once
    if router.policy == "round_robin":
        assert all(spread), spread  # the whole fleet answered
    if router.policy == "power_of_two":  # it weighs replicas by the load each reports
        polls = [r.requests().get(("/get_load", "200"), 0) for r in fleet.replicas]
        assert all(polls), polls
    if router.policy == "cache_aware":  # it routes on the token ids a replica renders for it
        asked = {k: n for r in fleet.replicas for k, n in r.requests().items() if k[0] in TOKEN_ENDPOINTS}
        print(f"cache_aware: token endpoints asked {asked}")
        assert asked and all(status == "200" for _, status in asked), asked


def test_n2_and_a_seed_through_the_router_equal_a_direct_request(fleet, router):  # noqa: F811
    """n=2 sampled with a seed: two choices, each the text a replica gives for that seed."""
    via, straight = openai_client(router.url), openai_client(fleet.replicas[1].url)
    for kind, ask in ASK.items():
        for stream in (False, True):
            got = ask(via, "active", stream, n=2, temperature=0.9, seed=11)
            assert len(got[0]) == 2 and all(t.strip() for t in got[0]), got
            assert got == ask(straight, "active", stream, n=2, temperature=0.9, seed=11), (router.policy, kind)


def test_json_schema_through_the_router(fleet, router):  # noqa: F811
    """response_format json_schema: every answer parses and validates; it equals a direct one."""
    via, straight = openai_client(router.url), openai_client(fleet.replicas[2].url)
    for kind, ask in ASK.items():
        extra = {"extra_body": {"response_format": FORMAT}} if kind == "completion" else {"response_format": FORMAT}
        for stream in (False, True):
            texts, _ = ask(via, fleet.published.refs["base"], stream, max_tokens=40, **extra)
            for text in texts:
                jsonschema.validate(json.loads(text), SCHEMA)
            assert texts == ask(straight, fleet.published.refs["base"], stream, max_tokens=40, **extra)[0]


def test_models_and_an_unknown_model_through_the_router(fleet, router):  # noqa: F811
    """The router passes /v1/models on from a replica: every name the tests send is listed; an
    unknown model is the replica's 404."""
    client = openai_client(router.url)
    listed = {m.id for m in client.models.list()}
    assert set(_models(fleet)) - {fleet.published.ids["french"]} <= listed, listed  # an id is listed by its spec
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)


def test_an_unsigned_composition_is_refused_through_the_router(fleet, router):  # noqa: F811
    """A spec whose composition nobody signed: the replica's 400, passed on by the router."""
    client = openai_client(router.url)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="smollm2+pirate@0.5", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4)
    assert "not signed" in str(err.value)
