"""Issue 34, the server on the public API: what `slm serve` needs below the API is reached
through slm.api (Runtime.stage/switch/staged/memory_estimate/scheduler, Store.active_ref_path);
the scheduler, below the API, takes a GenerationRequest and raises slm's errors, which one
function (slm.server.protocol.http_error) turns into HTTP statuses."""

from __future__ import annotations

import dataclasses

import pytest
import tomlkit

import slm
import slm.api
from helpers import copy_store, tiny_store
from slm.server.protocol import http_error, parse_request


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("server-on-api"), tiny_model, adapters=1)


@pytest.fixture
def store(template, tmp_path):
    return slm.Store.open(copy_store(template, tmp_path))


@pytest.fixture
def runtime(store):
    return slm.Runtime(store)


# -- one mapping of slm's errors to HTTP ------------------------------------------------------------

@pytest.mark.parametrize("error, status, kind, code", [
    (slm.InvalidInput, 400, "invalid_request_error", None),
    (slm.NotFound, 404, "invalid_request_error", "model_not_found"),  # (OpenAI's and vLLM's)
    (slm.Incompatible, 400, "invalid_request_error", None),
    (slm.BudgetExceeded, 400, "invalid_request_error", None),
    (slm.UsageError, 400, "invalid_request_error", None),
    (slm.NumericsError, 422, "invalid_request_error", None),
    (slm.Busy, 429, "rate_limit_exceeded", None),
    (slm.ShuttingDown, 503, "unavailable", None),
    (slm.IntegrityError, 500, "server_error", None),
    (slm.IOFailure, 500, "server_error", None),
    (slm.NeedsRecovery, 500, "server_error", None),
    # a signed statement the trust policy refuses, a composition that fails its health checks
    (slm.RollbackRefused, 403, "invalid_request_error", "rollback_refused"),
    (slm.EquivocationRefused, 403, "invalid_request_error", "equivocation_refused"),
    (slm.StatementExpired, 403, "invalid_request_error", "statement_expired"),
    (slm.WrongTarget, 403, "invalid_request_error", "wrong_target"),
    (slm.Unhealthy, 422, "invalid_request_error", "unhealthy"),
])
def test_each_slm_error_maps_to_its_http_status(error, status, kind, code):
    answer = http_error(error("what went\nwrong"))
    assert (answer.status, answer.kind) == (status, kind)
    assert answer.message == "what went wrong"  # the CLI's one line
    assert answer.code == code


def test_an_exception_that_is_not_an_slm_error_is_a_500_naming_the_bug():
    answer = http_error(KeyError("blk.0.attn_q.weight"))
    assert (answer.status, answer.kind) == (500, "server_error")
    assert answer.message == "internal error: KeyError: 'blk.0.attn_q.weight'"


def test_only_a_full_server_asks_the_client_to_retry_after_a_second():
    assert http_error(slm.Busy("full")).headers == {"Retry-After": "1"}
    assert http_error(slm.ShuttingDown("stopping")).headers == {}
    assert http_error(slm.InvalidInput("bad")).headers == {}


# -- the scheduler, below the API, speaks slm's errors ------------------------------------------------

def _request(prompt: str = "hello", **fields):
    return parse_request({"prompt": prompt, **fields}, chat=False).generation


def test_the_wire_request_becomes_the_schedulers_request_without_its_wire_fields():
    body = {"model": "tq", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0.5,
            "top_p": 0.9, "seed": 7, "stop": ["\n"], "stream": True, "stream_options": {"include_usage": True}}
    req = parse_request(body, chat=True).generation
    assert isinstance(req, slm.api.GenerationRequest)
    assert {f.name for f in dataclasses.fields(req)} & {"model", "stream", "include_usage"} == set()
    assert (req.chat, req.prompt, req.max_tokens) == (True, "", 3)
    assert req.messages == (slm.api.ChatMessage("user", "hi"),)
    assert (req.temperature, req.top_p, req.seed, req.stop) == (0.5, 0.9, 7, ("\n",))


def test_status_counts_rows_by_the_name_their_request_gave_its_composition(store, runtime):
    """What the model-server gauges read (slm.server.metrics): a request's rows (one per choice)
    under the name it was submitted with, else under its composition's id; queued until admitted."""
    loaded = runtime.stage(store.active())
    scheduler = runtime.scheduler(max_batch=2, max_queue=4)  # its thread not started: everything waits
    try:
        named = scheduler.submit(loaded, _request(n=2), name="prod")
        unnamed = scheduler.submit(loaded, _request())
        assert (named.name, unnamed.name) == ("prod", loaded.id)
        status = scheduler.status()
        assert status.waiting_by_name == {"prod": 2, loaded.id: 1} and status.admitted_by_name == {}
        assert (status.queued, status.kv_positions, status.kv_capacity, status.kv_usage) == (3, 0, 0, 0.0)
    finally:
        scheduler.stop()


def test_a_full_scheduler_refuses_with_busy_and_a_draining_one_with_shutting_down(store, runtime):
    loaded = runtime.stage(store.active())
    scheduler = runtime.scheduler(max_batch=1, max_queue=0)  # its thread not started: nothing runs
    try:
        handle = scheduler.submit(loaded, _request())
        with pytest.raises(slm.Busy, match="the server is full") as full:
            scheduler.submit(loaded, _request())
        assert not isinstance(full.value, slm.ShuttingDown)
        scheduler.drain()
        with pytest.raises(slm.ShuttingDown, match="shutting down"):
            scheduler.submit(loaded, _request())
        assert scheduler.busy() == 1 and not handle.finished
        assert scheduler.status() == slm.api.SchedulerStatus(queued=1, running=0, prefilling=0, max_batch=1, draining=True,
                                                             waiting_by_name={loaded.id: 1})
    finally:
        scheduler.stop()


def test_a_request_past_the_context_is_invalid_input_from_the_scheduler(store, runtime):
    loaded = runtime.stage(store.active())
    scheduler = runtime.scheduler()
    try:
        with pytest.raises(slm.InvalidInput, match="past the context"):
            scheduler.submit(loaded, _request(max_tokens=10 ** 6))
    finally:
        scheduler.stop()


# -- the Runtime's serving hooks ------------------------------------------------------------------

def test_the_runtime_stages_an_unstored_spec_and_lists_what_it_staged(store, runtime):
    spec = store.compose("tq", ["a1@0.5"])  # composed, never activated nor stored
    loaded = runtime.stage(spec)
    assert loaded.id == spec.id
    assert [(info.id, [a.weight for a in info.adapters]) for info in runtime.staged()] == [(spec.id, [0.5])]
    assert runtime.memory_estimate(loaded)["total"] > 0


def test_switch_keeps_the_current_composition_staged_past_max_staged(store):
    runtime = slm.Runtime(store, max_staged=1)
    active = runtime.switch(store.active())
    runtime.stage(store.compose("tq", ["a1@0.5"]))
    assert active.id in {info.id for info in runtime.staged()}


def test_the_runtime_refuses_to_stage_over_its_memory_budget(store):
    with pytest.raises(slm.BudgetExceeded, match="this composition needs an estimated"):
        slm.Runtime(store, memory_budget="1K").stage(store.active())
    assert slm.Runtime(store).staged() == []


def test_the_runtime_takes_config_memory_budget_unless_given_one(store):
    path = store.root / "config.toml"
    doc = tomlkit.parse(path.read_text())
    doc.setdefault("defaults", tomlkit.table())["memory_budget"] = "3M"
    path.write_text(tomlkit.dumps(doc))
    reopened = slm.Store.open(store.root)
    assert slm.Runtime(reopened).memory_budget == 3 << 20
    assert slm.Runtime(reopened, memory_budget="5M").memory_budget == 5 << 20


@pytest.mark.parametrize("threads", [0, 257])
def test_the_runtime_refuses_a_bad_thread_count_as_slm_run_does(store, threads):
    with pytest.raises(slm.InvalidInput, match=r"--threads must be between 1 and 256"):
        slm.Runtime(store, threads=threads)


@pytest.mark.parametrize("threads", [True, 1.0])
def test_the_runtime_refuses_a_thread_count_that_is_no_int_by_its_signature(store, threads):
    with pytest.raises(slm.InvalidInput, match=r"^Runtime\(\): threads must be int \| None, not "):
        slm.Runtime(store, threads=threads)


def test_the_active_ref_path_is_the_file_activate_rewrites(store):
    before = store.active_ref_path.read_bytes()
    store.activate("tq", ["a1@0.5"])
    after = store.active_ref_path.read_bytes()
    assert before != after and store.active().id in after.decode()
