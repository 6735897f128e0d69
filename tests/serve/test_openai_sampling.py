"""Issue 31, part 1: the OpenAI sampling surface of `slm serve` on the tiny model, with the real
`openai` client — no field ignored silently, fresh random seeds (reported, reproducible), n
choices, logprobs equal to Session.logits, penalties/bias/top_k/min_p — and the scheduler
in-process for a seeded request inside a batch of 8 mixed compositions. One implementation,
three doors: the server's answers equal Session.generate's and `slm run --json`'s."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import slm
from helpers import HANG_S, copy_store, refused, tiny_store
from serve_helpers import Server

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

PROMPT = "the cat sat on"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("openai-sampling"), tiny_model, adapters=2)


@pytest.fixture(scope="module")
def server(template, tmp_path_factory):
    """One server for the module (its store a copy: the template stays as built)."""
    root = copy_store(template, tmp_path_factory.mktemp("served"))
    running = Server(root, "--threads", "1", "--max-batch", "8")
    yield running
    assert running.stop() == 0
    assert not any("Traceback" in line for line in running.lines), "\n".join(running.lines)


@pytest.fixture
def store(template, tmp_path):
    return slm.Store.open(copy_store(template, tmp_path))


@pytest.fixture
def session(store):
    return slm.Runtime(store, threads=1).session()


def _error(err: openai.BadRequestError) -> str:
    message = err.body["message"] if isinstance(err.body, dict) else str(err)
    assert "\n" not in message and "Traceback" not in message
    return message


# -- no silent 200 --------------------------------------------------------------------------------

@pytest.mark.parametrize("endpoint, fields, named", [
    ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "unsupported field: audio"),
    ("chat", {"modalities": ["text", "audio"]}, "unsupported field: modalities"),
    ("chat", {"prediction": {"type": "content", "content": "x"}}, "unsupported field: prediction"),
    ("chat", {"web_search_options": {}}, "unsupported field: web_search_options"),
    ("chat", {"functions": [{"name": "f", "parameters": {}}]}, "unsupported field: functions"),
    ("chat", {"function_call": "auto"}, "unsupported field: function_call"),
    ("chat", {"reasoning_effort": "low"}, "unsupported field: reasoning_effort"),
    ("chat", {"frequncy_penalty": 0.5}, "unknown field: frequncy_penalty"),
    ("chat", {"repetition_penalti": 1.1}, "unknown field: repetition_penalti"),
    ("completions", {"echo": True}, "unsupported field: echo"),
    ("completions", {"suffix": "the end"}, "unsupported field: suffix"),
    ("completions", {"best_of": 3}, "unsupported field: best_of"),
    ("completions", {"top_logprobs": 2}, "unsupported field: top_logprobs (on chat completions only)"),
    ("completions", {"max_completion_tokens": 4}, "unsupported field: max_completion_tokens (on chat"),
    ("completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "unsupported field: tools (on chat completions only)"),
])
def test_a_field_slm_does_not_implement_is_a_400_naming_it(server, endpoint, fields, named):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as refused:
        if endpoint == "chat":
            client.chat.completions.create(model="active", messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=2, extra_body=fields)
        else:
            client.completions.create(model="active", prompt=PROMPT, max_tokens=2, extra_body=fields)
    assert refused.value.status_code == 400
    assert _error(refused.value).startswith(named)


def test_fields_that_cannot_change_an_answer_are_accepted_and_change_nothing(server):
    client = server.client()
    messages = [{"role": "user", "content": PROMPT}]
    plain = client.chat.completions.create(model="active", messages=messages, max_tokens=MAX_TOKENS)
    ignored = client.chat.completions.create(model="active", messages=messages, max_tokens=MAX_TOKENS,
                                             user="someone", metadata={"k": "v"}, store=False,
                                             service_tier="auto", extra_body={"tools": None})
    assert ignored.choices[0].message.content == plain.choices[0].message.content
    no_ops = client.completions.create(model="active", prompt=PROMPT, max_tokens=MAX_TOKENS, echo=False,
                                       best_of=1, user="someone")
    assert no_ops.choices[0].text == client.completions.create(model="active", prompt=PROMPT,
                                                               max_tokens=MAX_TOKENS).choices[0].text


# -- random seeds -----------------------------------------------------------------------------------

def _sampled(client, **extra):
    raw = client.completions.with_raw_response.create(model="active", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                      temperature=1.0, **extra)
    return raw.parse(), raw.headers["x-slm-seed"]


def test_requests_without_a_seed_differ_and_each_is_reproduced_by_its_reported_seed(server, session):
    client = server.client()
    answers = [_sampled(client) for _ in range(3)]
    texts = [reply.choices[0].text for reply, _ in answers]
    seeds = [int(header) for _, header in answers]
    assert len(set(texts)) == 3 and len(set(seeds)) == 3
    for (reply, header), text in zip(answers, texts):
        assert reply.choices[0].model_extra["seed"] == int(header)
        again, _ = _sampled(client, seed=int(header))
        assert again.choices[0].text == text  # byte for byte
        alone = session.generate(PROMPT, MAX_TOKENS, temperature=1.0, seed=int(header))
        assert alone.text == text and alone.seed == int(header)  # the API's door


def _slm_run_json(store: slm.Store, *args: str) -> dict:
    """`slm run PROMPT -n MAX_TOKENS ARGS... --json` in-process, its JSON."""
    import contextlib
    import io

    from slm.cli import run as cli_run

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_run(["--store", str(store.root), "run", PROMPT, "-n", str(MAX_TOKENS), *args, "--json"])
    assert code == 0
    return json.loads(out.getvalue())


def test_session_and_slm_run_report_the_random_seed_they_drew(session, store):
    first, second = (session.generate(PROMPT, MAX_TOKENS, temperature=1.0) for _ in range(2))
    assert first.seed != second.seed
    assert session.generate(PROMPT, MAX_TOKENS, temperature=1.0, seed=first.seed).text == first.text
    result = _slm_run_json(store, "--temperature", "1")
    assert isinstance(result["seed"], int)
    assert session.generate(PROMPT, MAX_TOKENS, temperature=1.0, seed=result["seed"]).text == result["text"]


# -- n choices --------------------------------------------------------------------------------------

def test_n_choices_are_indexed_differ_and_each_is_reproduced_by_its_seed(server):
    client = server.client()
    raw = client.completions.with_raw_response.create(model="active", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                      temperature=1.0, n=4)
    reply = raw.parse()
    seeds = [int(s) for s in raw.headers["x-slm-seed"].split(",")]
    assert [c.index for c in reply.choices] == [0, 1, 2, 3] and len(seeds) == 4
    assert [c.model_extra["seed"] for c in reply.choices] == seeds
    texts = [c.text for c in reply.choices]
    assert len(set(texts)) > 1
    for seed, text in zip(seeds, texts):
        assert _sampled(client, seed=seed)[0].choices[0].text == text
    assert reply.usage.completion_tokens == sum(
        client.completions.create(model="active", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=1.0,
                                  seed=s).usage.completion_tokens for s in seeds)


def test_a_seeded_request_with_n_choices_uses_seed_plus_i(server):
    client = server.client()
    reply = client.chat.completions.create(model="active", messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=MAX_TOKENS, temperature=1.0, n=3, seed=100)
    for i, choice in enumerate(reply.choices):
        assert choice.model_extra["seed"] == 100 + i
        alone = client.chat.completions.create(model="active", messages=[{"role": "user", "content": PROMPT}],
                                               max_tokens=MAX_TOKENS, temperature=1.0, seed=100 + i)
        assert choice.message.content == alone.choices[0].message.content


def test_streamed_choices_carry_their_index_and_usage_counts_them_all(server):
    client = server.client()
    whole = client.chat.completions.create(model="active", messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=MAX_TOKENS, temperature=1.0, n=3, seed=5)
    texts, finished = ["", "", ""], set()
    usage = None
    for chunk in client.chat.completions.create(model="active", messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=MAX_TOKENS, temperature=1.0, n=3, seed=5, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert texts == [c.message.content for c in whole.choices] and finished == {0, 1, 2}
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_n_over_the_servers_max_batch_is_a_400(server):
    with pytest.raises(openai.BadRequestError) as refused:
        server.client().completions.create(model="active", prompt=PROMPT, max_tokens=2, n=9)
    assert "at most 8" in _error(refused.value)


# -- logprobs ---------------------------------------------------------------------------------------

def _log_softmax(rows: np.ndarray) -> np.ndarray:
    wide = rows.astype(np.float64)
    shifted = wide - wide.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_logprobs_equal_the_log_softmax_of_session_logits_at_every_position(template, tmp_path, store):
    """A greedy run with top_logprobs=5: each token's logprob and its 5 alternatives equal
    log-softmax(Session.logits) at that position within 1e-5 (the server's, the API's and
    `slm run --logprobs`'s numbers alike). In the exact mode, with Session.logits as one pass over
    the whole sequence (generation: a prefill then one-token steps): only float32 products give
    those two paths the same numbers to 1e-5 (int8 rounds a product's input to other values).
    The default mode, through Session.logits(ids, prompt_length): test_openai_logprobs_mode.py."""
    session = slm.Runtime(store, threads=1, exact=True).session()
    server = Server(copy_store(template, tmp_path / "exact"), "--threads", "1", "--exact")
    try:
        _check_logprobs(server, session)
    finally:
        assert server.stop() == 0


def _check_logprobs(server, session):
    client = server.client()
    reply = client.completions.create(model="active", prompt=PROMPT, max_tokens=MAX_TOKENS, logprobs=5)
    api = session.generate(PROMPT, MAX_TOKENS, logprobs=5)
    tokens = [t for t in api.tokens]  # (the tiny model has no end-of-generation token in its answers here)
    assert len(api.logprobs) == len(tokens) == len(reply.choices[0].logprobs.tokens)
    expected = _log_softmax(session.logits(list(api.prompt_tokens) + tokens))[len(api.prompt_tokens) - 1:-1]
    wire = reply.choices[0].logprobs
    for i, (token, record) in enumerate(zip(tokens, api.logprobs)):
        top5 = np.argsort(-expected[i], kind="stable")[:5]
        assert record.token == token and abs(record.logprob - expected[i, token]) < 1e-5
        assert [a.token for a in record.top] == top5.tolist()
        assert np.allclose([a.logprob for a in record.top], expected[i, top5], atol=1e-5)
        assert abs(wire.token_logprobs[i] - expected[i, token]) < 1e-5 and wire.tokens[i] == record.text
        assert sorted(wire.top_logprobs[i].values(), reverse=True) == pytest.approx(
            sorted({a.text: a.logprob for a in reversed(record.top)}.values(), reverse=True), abs=1e-5)
    assert wire.text_offset == list(np.cumsum([0] + [len(t) for t in wire.tokens[:-1]]))


def test_slm_run_logprobs_are_the_apis_and_the_log_softmax_of_its_own_logits(session, store, tmp_path):
    """`slm run --logprobs` gives the API's numbers, and they are the float64 log-softmax of the
    very logits the run sampled from (the rows --logits-out saves), to the last bits."""
    api = session.generate(PROMPT, MAX_TOKENS, logprobs=5)
    plain = _slm_run_json(store, "--logprobs", "5")["logprobs"]
    assert plain == json.loads(json.dumps([r.to_json() for r in api.logprobs]))
    # (--logits-out prefills with every position's logits; the rows it saves are the reference)
    cli = _slm_run_json(store, "--logprobs", "5", "--logits-out", str(tmp_path / "logits.npy"))
    assert [r["token"] for r in cli["logprobs"]] == list(api.tokens)
    rows = _log_softmax(np.load(tmp_path / "logits.npy"))[len(cli["prompt_tokens"]) - 1:]
    for row, record in zip(rows, cli["logprobs"]):
        assert abs(record["logprob"] - row[record["token"]]) < 1e-12
        assert [a["token"] for a in record["top"]] == np.argsort(-row, kind="stable")[:5].tolist()


def test_chat_logprobs_have_openais_shape_streamed_and_not(server, session):
    client = server.client()
    messages = [{"role": "user", "content": PROMPT}]
    reply = client.chat.completions.create(model="active", messages=messages, max_tokens=MAX_TOKENS, logprobs=True,
                                           top_logprobs=3)
    api = session.generate(PROMPT, MAX_TOKENS, chat=True, logprobs=3)
    content = reply.choices[0].logprobs.content
    assert [c.token for c in content] == [r.text for r in api.logprobs]
    assert np.allclose([c.logprob for c in content], [r.logprob for r in api.logprobs], atol=1e-5)
    assert all(len(c.top_logprobs) == 3 and c.bytes == list(c.token.encode()) for c in content)
    streamed = []
    for chunk in client.chat.completions.create(model="active", messages=messages, max_tokens=MAX_TOKENS,
                                                logprobs=True, top_logprobs=3, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed += choice.logprobs.content
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="active", messages=messages, max_tokens=2, top_logprobs=2)
    assert "top_logprobs needs logprobs: true" in _error(refused.value)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="active", messages=messages, max_tokens=2, logprobs=True,
                                       top_logprobs=21)
    assert _error(refused.value).startswith("top_logprobs must be an integer between 0 and 20")


# -- penalties, bias, filters: one implementation, three doors --------------------------------------

def test_penalties_bias_and_filters_give_the_apis_answer(server, session):
    client = server.client()
    greedy = session.generate(PROMPT, MAX_TOKENS)
    banned = greedy.tokens[0]
    options = dict(frequency_penalty=0.8, presence_penalty=0.4, logit_bias={str(banned): -100})
    extra = dict(repeat_penalty=1.3, top_k=5, min_p=0.05)
    reply = client.completions.create(model="active", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.9,
                                      seed=11, extra_body=extra, **options)
    api = session.generate(PROMPT, MAX_TOKENS, temperature=0.9, seed=11, **extra,
                           **{**options, "logit_bias": {banned: -100}})
    assert reply.choices[0].text == api.text
    assert banned not in api.tokens
    biased = session.generate(PROMPT, MAX_TOKENS, logit_bias={banned: -100})
    assert biased.tokens[0] != banned  # the bias changes the greedy answer


@pytest.mark.parametrize("args, message", [
    (["--top-k", "-1"], "top_k must be an integer >= 0"),
    (["--min-p", "2"], "min_p must be a number in [0, 1]"),
    (["--repeat-penalty", "0"], "repeat_penalty must be a finite number > 0"),
    (["--frequency-penalty", "3"], "frequency_penalty must be a number between -2 and 2"),
    (["--presence-penalty", "-2.5"], "presence_penalty must be a number between -2 and 2"),
    (["--logprobs", "21"], "logprobs must be an integer between 0 and 20"),
])
def test_slm_run_refuses_a_bad_sampling_option_in_one_line(cli, store, args, message):
    r = refused(cli, store.root, slm.ExitCode.INVALID_INPUT, "run", PROMPT, "-n", "2", *args)
    assert message in r.err


def test_a_logit_bias_id_outside_the_vocabulary_is_a_400(server, session):
    vocab = session.logits([1]).shape[-1]
    with pytest.raises(openai.BadRequestError) as refused:
        server.client().completions.create(model="active", prompt=PROMPT, max_tokens=2,
                                           logit_bias={str(vocab): 5})
    assert f"below {vocab}" in _error(refused.value)


# -- a seed inside a batch of 8 mixed compositions (the scheduler in-process) -----------------------

def test_a_seeded_request_is_reproduced_byte_for_byte_inside_a_batch_of_8_mixed_compositions(store):
    runtime = slm.Runtime(store, threads=1)
    specs = [store.compose("tq"), store.compose("tq", ["a1@0.5"]), store.compose("tq", ["a2@0.8"])]
    loaded = [runtime.stage(spec) for spec in specs]

    def request(prompt: str, seed: int | None) -> slm.api.GenerationRequest:
        return slm.api.GenerationRequest(prompt=prompt, max_tokens=MAX_TOKENS,
                                         temperature=1.0, top_p=0.95, seed=seed, stop=())

    def run(batch: list[tuple[int, str, int | None]]) -> list[str]:
        scheduler = runtime.scheduler(max_batch=8)
        try:  # (all queued before the engine starts: admitted together)
            handles = [scheduler.submit(loaded[which], request(prompt, seed)) for which, prompt, seed in batch]
            scheduler.start()
            return [_choice_texts(handle)[0] for handle in handles]
        finally:
            scheduler.stop()

    target = (1, PROMPT, 4242)
    alone = run([target])[0]
    others = [(i % 3, f"{PROMPT} {i}", None) for i in range(7)]
    batched = run(others[:3] + [target] + others[3:])[3]
    assert batched == alone
    assert alone == runtime.session(specs[1]).generate(PROMPT, MAX_TOKENS, temperature=1.0, top_p=0.95,
                                                       seed=4242).text


def test_n_choices_prefill_the_prompt_once_and_each_equals_its_seed_alone(store, monkeypatch):
    """Choice 0 prefills; the others copy its keys and values (the prompt cache) and still give
    what their seed gives alone."""
    import slm.engine.scheduler as scheduling

    runtime = slm.Runtime(store, threads=1)
    loaded = runtime.stage(store.active())
    prefilled = []
    real = scheduling.prefill_next

    def counted(seq, chunk):
        prefilled.append(id(seq))
        return real(seq, chunk)

    monkeypatch.setattr(scheduling, "prefill_next", counted)
    prompt = "a prompt that no other test of this module prefills"
    req = slm.api.GenerationRequest(prompt=prompt, max_tokens=MAX_TOKENS,
                                    temperature=1.0, top_p=1.0, seed=77, stop=(), n=3)
    scheduler = runtime.scheduler(max_batch=8)
    try:
        handle = scheduler.submit(loaded, req)
        assert handle.seeds == (77, 78, 79)
        scheduler.start()
        texts = _choice_texts(handle)
    finally:
        scheduler.stop()
    assert len(set(prefilled)) == 1  # one sequence prefilled the prompt
    session = runtime.session()
    for i in range(3):
        assert texts[i] == session.generate(prompt, MAX_TOKENS, temperature=1.0, seed=77 + i).text


def _choice_texts(handle) -> list[str]:
    """Each choice's streamed text, once every choice ended by itself (no failure)."""
    texts = [""] * len(handle.seeds)
    for event in handle.events(timeout=HANG_S):
        assert not isinstance(event, slm.api.FailedEvent), event
        if isinstance(event, slm.api.TextEvent):
            texts[event.choice] += event.piece
    return texts


def test_streamed_completion_logprobs_join_into_the_whole_answers(server):
    client = server.client()
    whole = client.completions.create(model="active", prompt=PROMPT, max_tokens=MAX_TOKENS, logprobs=2)
    tokens, logprobs, offsets, text = [], [], [], ""
    for chunk in client.completions.create(model="active", prompt=PROMPT, max_tokens=MAX_TOKENS, logprobs=2,
                                           stream=True):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                logprobs += choice.logprobs.token_logprobs
                offsets += choice.logprobs.text_offset
    wire = whole.choices[0].logprobs
    assert text == whole.choices[0].text
    assert (tokens, logprobs, offsets) == (wire.tokens, wire.token_logprobs, wire.text_offset)
