"""`slm run`'s flags for vLLM's options (issue 46): the one request type's options, as the
server's fields of the same names give them (tests/serve/test_openai_vllm_fields.py)."""

from __future__ import annotations

import pytest

from helpers import copy_store, tiny_store
from slm import ExitCode

PROMPT = "the cat sat on"


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("run-vllm"), tiny_model)


@pytest.fixture
def run(cli, template, tmp_path):
    root = copy_store(template, tmp_path)

    def invoke(*args: str):
        return cli("--store", root, "run", PROMPT, "--max-tokens", "12", "--json", *args)

    return invoke


def test_stop_token_id_ends_the_answer_and_include_stop_keeps_its_text(run):
    plain = run().json()
    ids = plain["tokens"]
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    stopped = run("--stop-token-id", str(ids[k])).json()
    assert stopped["tokens"] == ids[:k + 1] and stopped["stop_reason"] == "stop"
    kept = run("--stop-token-id", str(ids[k]), "--include-stop").json()
    assert plain["text"].startswith(kept["text"]) and len(kept["text"]) > len(stopped["text"])


def test_min_tokens_holds_off_a_stop_token(run):
    ids = run().json()["tokens"]
    held = run("--stop-token-id", str(ids[0]), "--min-tokens", "3").json()
    assert len(held["tokens"]) > 3 and ids[0] not in held["tokens"][:3]


def test_a_refused_combination_is_one_line_and_exit_code(run):
    r = run("--repeat-penalty", "1.2", "--repetition-penalty", "1.1")
    assert r.code == ExitCode.INVALID_INPUT and "not both" in r.err and r.err.count("\n") == 1
