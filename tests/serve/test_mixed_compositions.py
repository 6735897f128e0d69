"""Requests on several compositions of one base share each decode step (issue 35: 8 requests on
4 compositions through `slm serve` cost about what 8 on one do): the scheduler groups its running
rows by base, not by composition, so the base's weights are read once per step for all of them,
each row adding its own composition's overlays; and each answer is, token for token, the same
request's answer served alone. The slm_batch_rows and slm_step_compositions histograms observe
each decode step: how many rows and how many compositions it ran."""

from __future__ import annotations

import threading

import pytest

import slm
from helpers import HANG_S, copy_store, tiny_store
from serve_helpers import Server
from slm.server.metrics import Metrics

SPECS = ["tq", "tq+a1", "tq+a2@0.5", "tq+a1@0.5+a3"]
PROMPTS = ["the cat sat on", "once upon a time"]
MAX_TOKENS = 16
ROWS = len(SPECS) * len(PROMPTS)  # 8: every composition twice, every prompt on every composition
# LoRAs strong enough that each composition answers differently from the others
LORA = dict(rank=4, std=0.5, hidden=64, intermediate=128, layers=2, kv_dim=32)


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    # tq, the quantized tiny base, and tf, the float one: another base of the same shapes
    return tiny_store(tmp_path_factory.mktemp("mixed"), tiny_model, adapters=3, lora=LORA,
                      bases={"tq": "gguf_q", "tf": "gguf"})


@pytest.fixture
def runtime(template, tmp_path):
    store = slm.Store.open(copy_store(template, tmp_path))
    return slm.Runtime(store, threads=1)


def _request(prompt: str, eos: list[int]) -> slm.api.GenerationRequest:
    # greedy, and the end-of-sequence tokens forbidden: every answer is MAX_TOKENS tokens long
    return slm.api.GenerationRequest(prompt=prompt, max_tokens=MAX_TOKENS,
                                     temperature=0.0, top_p=1.0, seed=None, stop=(),
                                     logit_bias=tuple((e, -100.0) for e in eos))


def _text(handle) -> str:
    """A request's text pieces, once it ended with MAX_TOKENS tokens."""
    text, end = "", None
    for event in handle.events(timeout=HANG_S):
        if isinstance(event, slm.api.TextEvent):
            text += event.piece
        else:
            end = event
    assert isinstance(end, slm.api.DoneEvent) and end.completion_tokens == MAX_TOKENS, end
    return text


def _work(runtime) -> list[tuple[object, slm.api.GenerationRequest]]:
    """The 8 jobs: (staged composition, request), compositions interleaved (as requests come)."""
    loaded = [runtime.stage(spec) for spec in SPECS]
    eos = sorted(loaded[0].tokenizer.eos_ids)
    return [(loaded[i % len(SPECS)], _request(PROMPTS[i // len(SPECS)], eos)) for i in range(ROWS)]


def _alone(runtime, work) -> list[str]:
    """Each request served alone, one after the other, by a scheduler of its own."""
    scheduler = runtime.scheduler(max_batch=8)
    scheduler.start()
    try:
        return [_text(scheduler.submit(loaded, req)) for loaded, req in work]
    finally:
        scheduler.stop()


def _run_together(scheduler, work) -> list[str]:
    """The jobs queued before the engine starts (admitted together), run to their end."""
    handles = [scheduler.submit(loaded, req) for loaded, req in work]
    scheduler.start()
    try:
        return [_text(handle) for handle in handles]
    finally:
        scheduler.stop()


def _histogram(metrics: Metrics, name: str) -> dict[str, float]:
    """A histogram's cumulative buckets, le -> count, and "sum": the sum of what it observed."""
    samples = [s for family in metrics.registry.collect() if family.name == name for s in family.samples]
    return {**{s.labels["le"]: s.value for s in samples if s.name == f"{name}_bucket"},
            "sum": next(s.value for s in samples if s.name == f"{name}_sum")}


def test_eight_requests_on_four_compositions_are_decoded_in_shared_steps(runtime):
    work = _work(runtime)
    metrics = Metrics()
    texts = _run_together(runtime.scheduler(max_batch=8, metrics=metrics), work)
    rows, comps = _histogram(metrics, "slm_batch_rows"), _histogram(metrics, "slm_step_compositions")
    # one prompt is prefilled between two steps: ROWS - 1 steps while the rows join, then each
    # row's remaining tokens, one a step (had the compositions been decoded apart: 4x as many)
    assert rows["+Inf"] == comps["+Inf"] == (ROWS - 1) + (MAX_TOKENS - 1)
    assert rows["sum"] == ROWS * (MAX_TOKENS - 1)  # every token after the first: a row of one of them
    # all 8 rows ran together in MAX_TOKENS - ROWS steps, each on all 4 compositions (and more
    # steps had 4, while rows joined or left)
    assert comps["+Inf"] - comps["3.0"] >= MAX_TOKENS - ROWS > 0
    assert texts == _alone(runtime, work)
    for p in range(len(PROMPTS)):  # each row ran its own composition: one prompt, four answers
        assert len(set(texts[p * len(SPECS):(p + 1) * len(SPECS)])) == len(SPECS)


def test_a_composition_staged_after_its_base_left_the_staged_table_shares_the_running_rows_step(template, tmp_path):
    """A runtime that keeps one composition staged: the first one on tq leaves the table when tf
    is staged, while a request still runs on it; the next one on tq shares its tensors (not a
    second map of the base, re-hashed and packed again) and so its decode step."""
    runtime = slm.Runtime(slm.Store.open(copy_store(template, tmp_path)), threads=1, max_staged=1)
    first = runtime.stage("tq+a1")
    runtime.stage("tf")
    assert [c.base_name for c in runtime.staged()] == ["tf"]
    later = runtime.stage("tq+a2")
    assert later.model.t is first.model.t
    eos = sorted(first.tokenizer.eos_ids)
    metrics = Metrics()
    work = [(first, _request(PROMPTS[0], eos)), (later, _request(PROMPTS[1], eos))]
    _run_together(runtime.scheduler(max_batch=8, metrics=metrics), work)
    rows, comps = _histogram(metrics, "slm_batch_rows"), _histogram(metrics, "slm_step_compositions")
    assert rows["+Inf"] == (len(work) - 1) + (MAX_TOKENS - 1)  # one step for both (two: twice as many)
    assert comps["+Inf"] - comps["1.0"] == MAX_TOKENS - len(work)  # ...on both compositions


def test_the_server_decodes_requests_on_four_compositions_together_and_as_alone(template, tmp_path, runtime):
    work = _work(runtime)
    eos = {str(token): -100 for token, _ in work[0][1].logit_bias}
    bodies = [{"model": SPECS[i % len(SPECS)], "prompt": PROMPTS[i // len(SPECS)], "max_tokens": MAX_TOKENS,
               "temperature": 0, "logit_bias": eos} for i in range(ROWS)]
    server = Server(runtime.store.root, "--threads", "1", "--max-batch", "8")
    try:
        alone = []
        for body in bodies:
            code, answer = server.json("POST", "/v1/completions", body)
            assert code == 200, answer
            alone.append(answer["choices"][0]["text"])
        together: list = [None] * ROWS

        def ask(i: int) -> None:
            together[i] = server.json("POST", "/v1/completions", bodies[i])

        for _ in range(3):  # at once, as a client's concurrent requests come
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(ROWS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(HANG_S)
            assert [code for code, _ in together] == [200] * ROWS, together
            assert [answer["choices"][0]["text"] for _, answer in together] == alone
        _, _, text = server.http("GET", "/metrics")
    finally:
        assert server.stop() == 0
    comps = {line.split('le="')[1].split('"')[0]: float(line.split()[-1])
             for line in text.decode().splitlines() if line.startswith("slm_step_compositions_bucket")}
    assert comps["+Inf"] > comps["1.0"], f"no decode step ran rows of more than one composition: {comps}"
    steps = [float(line.split()[-1]) for line in text.decode().splitlines()
             if line.startswith("slm_decode_step_seconds_count")]
    assert steps == [comps["+Inf"]]  # every step timed, and observed once
    assert b"\nprocess_cpu_seconds_total " in text  # the server's CPU time, beside the wall time
