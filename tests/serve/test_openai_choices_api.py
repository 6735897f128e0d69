"""n choices through the API door (issue 31: one implementation, three doors): Session.
generate_choices(prompt, n, seed=s) gives the server's n choices of the same request, choice by
choice (seed s + i each); without a seed, each choice has a fresh seed of its own, reported, that
reproduces it."""

from __future__ import annotations

import pytest

import slm
from helpers import copy_store, tiny_store
from serve_helpers import Server

openai = pytest.importorskip("openai")

PROMPT = "the cat sat on"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("choices-api"), tiny_model)


def test_session_choices_equal_the_servers_n_choices(template, tmp_path):
    session = slm.Runtime(slm.Store.open(copy_store(template, tmp_path / "api")), threads=1).session()
    server = Server(copy_store(template, tmp_path / "served"), "--threads", "1")
    try:
        reply = server.client().completions.create(model="active", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                   temperature=1.0, n=4, seed=7, extra_body={"top_k": 40})
    finally:
        assert server.stop() == 0
    choices = session.generate_choices(PROMPT, 4, MAX_TOKENS, temperature=1.0, seed=7, top_k=40)
    assert [g.seed for g in choices] == [7, 8, 9, 10] == [c.model_extra["seed"] for c in reply.choices]
    assert [g.text for g in choices] == [c.text for c in reply.choices]
    assert len({g.text for g in choices}) > 1


def test_unseeded_choices_differ_and_each_is_reproduced_by_its_seed(template, tmp_path):
    session = slm.Runtime(slm.Store.open(copy_store(template, tmp_path)), threads=1).session()
    choices = session.generate_choices(PROMPT, 3, MAX_TOKENS, temperature=1.0)
    assert len({g.seed for g in choices}) == 3 and len({g.text for g in choices}) > 1
    for g in choices:
        assert session.generate(PROMPT, MAX_TOKENS, temperature=1.0, seed=g.seed).text == g.text


@pytest.mark.parametrize("n", [0, -2, 1.5, True])
def test_a_bad_n_is_invalid_input(template, tmp_path, n):
    session = slm.Runtime(slm.Store.open(copy_store(template, tmp_path)), threads=1).session()
    with pytest.raises(slm.InvalidInput, match="n must be an integer >= 1"):
        session.generate_choices(PROMPT, n, MAX_TOKENS)
