"""n choices and the memory budget (issue 31): a request's n choices run at once, each with
its own KV cache, so the budget is checked for the whole request, not for one choice: a
request whose one choice fits but whose n do not is refused (400 over HTTP, BudgetExceeded in
the API) before anything runs. On SmolLM2 (45 KiB of keys and values a position): on the tiny
model a KV cache is too small to tell n caches from one under the budget that staging needs.)"""

from __future__ import annotations

import pytest

import slm
from helpers import copy_store, tiny_store
from serve_helpers import Server
from slm.ops.infer import budget

N = 4
MAX_TOKENS = 2000


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("n-budget"), tiny_model)


def _request(n: int) -> slm.api.GenerationRequest:
    return slm.api.GenerationRequest(prompt="the cat sat on", max_tokens=MAX_TOKENS,
                                     temperature=1.0, top_p=1.0, seed=1, stop=(), n=n)


def _between(store, base: str) -> int:
    """A budget that staging and one choice fit in and N choices do not."""
    loaded = slm.Runtime(store, threads=1).stage(store.compose(base))
    prompt = len(loaded.tokenizer.encode("the cat sat on"))
    one = budget.of_staged(loaded.staged, prompt + MAX_TOKENS, prompt).total
    many = budget.of_staged(loaded.staged, prompt + MAX_TOKENS, prompt, sequences=N).total
    staging = budget.of_staged(loaded.staged).total
    assert many > max(one, staging) + (16 << 20)
    return (max(one, staging) + many) // 2


@pytest.fixture(scope="module")
def smol(tmp_path_factory, smollm2_gguf):
    store = slm.Store.init(tmp_path_factory.mktemp("n-budget-smol") / "store")
    store.import_base(smollm2_gguf, name="smol")
    store.activate("smol")
    return store, _between(store, "smol")


def test_the_estimate_counts_a_kv_cache_per_sequence(template, tmp_path):
    store = slm.Store.open(copy_store(template, tmp_path))
    loaded = slm.Runtime(store, threads=1).stage(store.compose("tq"))
    one = budget.of_staged(loaded.staged, 300, 10)
    many = budget.of_staged(loaded.staged, 300, 10, sequences=N)
    assert many.kv_cache == N * one.kv_cache > 0
    assert (many.base, many.adapters, many.runtime) == (one.base, one.adapters, one.runtime)


@pytest.mark.real_model
def test_n_choices_over_the_budget_are_refused_when_one_would_fit(smol):
    store, limit = smol
    runtime = slm.Runtime(store, threads=1, memory_budget=str(limit))
    loaded = runtime.stage(store.compose("smol"))
    scheduler = runtime.scheduler(max_batch=8)
    try:
        assert len(scheduler.submit(loaded, _request(1)).seeds) == 1  # (queued: the engine is not started)
        with pytest.raises(slm.BudgetExceeded, match=f"this request \\({N} choices\\) needs an estimated"):
            scheduler.submit(loaded, _request(N))
    finally:
        scheduler.stop()


@pytest.mark.real_model
def test_the_server_answers_400_to_n_choices_over_its_budget(smol):
    store, limit = smol
    server = Server(store.root, "--threads", "1", "--memory-budget", str(limit))
    try:
        body = {"prompt": "the cat sat on", "max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 1}
        code, refused = server.json("POST", "/v1/completions", {**body, "n": N})
        assert code == 400 and f"({N} choices)" in refused["error"]["message"]
        assert "memory budget" in refused["error"]["message"]
        code, one = server.json("POST", "/v1/completions", {**body, "n": 1, "max_tokens": 4})
        assert code == 200 and len(one["choices"]) == 1
    finally:
        assert server.stop() == 0
