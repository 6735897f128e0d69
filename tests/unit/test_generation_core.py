"""The one generation core (issue 34): the stop rules and streamed text (slm.engine.stops), the
step-wise generator over rows (slm.engine.generation) that `slm run`, the API and the server
drive, and the prompt-cache interface with its memory and disk backends."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import one_line, snapshot
from slm.errors import InvalidInput, NumericsError
from slm.engine import generation
from slm.engine.generate import PREFILL_CHUNK, generate
from slm.engine.generation import decode, first_token, new_sequence, prefill_next
from slm.engine.prompt_cache import MemoryPromptCache
from slm.engine.sampling import Sampler
from slm.engine.stops import CONTEXT, EOS, LENGTH, STOP, StopRules
from slm.ops.infer.prefix_cache import DiskPromptCache, budget_of

# -- stop rules and streamed text (a vocabulary of one character per token) --------------------
VOCAB = "abcdefghijklmnopqrstuvwxyzEND "
EOS_ID = 99


def _decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids if i != EOS_ID)


def _ids(text: str) -> list[int]:
    return [VOCAB.index(c) for c in text]


def _rules(max_tokens=100, stops=(), caller=None):
    sent: list[str] = []
    return StopRules({EOS_ID}, max_tokens, _decode, stops, on_text=sent.append, caller=caller), sent


def _feed(rules: StopRules, ids: list[int], full_after: int | None = None) -> str | None:
    for n, token in enumerate(ids, 1):
        reason = rules.take(token, cache_full=full_after is not None and n >= full_after)
        if reason:
            return reason
    return None


def test_a_stop_sequence_is_never_sent_even_in_part():
    rules, sent = _rules(stops=["END"])
    assert _feed(rules, _ids("ab")) is None and sent == ["a", "b"]
    assert _feed(rules, _ids("EN")) is None and sent == ["a", "b"], "a tail that may become END waits"
    assert _feed(rules, _ids("D")) == STOP
    assert "".join(sent) == "ab" == rules.text and rules.ids == _ids("abEND")


def test_a_held_tail_goes_out_once_it_cannot_become_a_stop_sequence():
    rules, sent = _rules(stops=["END"])
    assert _feed(rules, _ids("aEx")) is None
    assert "".join(sent) == "aEx"
    assert rules.finish(LENGTH) == LENGTH and "".join(sent) == "aEx"


def test_a_held_tail_is_flushed_when_generation_ends_otherwise():
    rules, sent = _rules(max_tokens=3, stops=["END"])
    assert _feed(rules, _ids("abE")) == LENGTH
    assert "".join(sent) == "abE" == rules.text


def test_the_checks_run_in_order_caller_eos_stop_length_context():
    caller = lambda token: "switched" if token == EOS_ID else None  # noqa: E731
    assert _feed(_rules(caller=caller)[0], [EOS_ID]) == "switched", "the caller's reason comes first"
    assert _feed(_rules(max_tokens=1)[0], [EOS_ID]) == EOS, "eos before length"
    assert _feed(_rules(max_tokens=3, stops=["END"])[0], _ids("END")) == STOP, "a stop sequence before length"
    assert _feed(_rules(max_tokens=2)[0], _ids("ab"), full_after=2) == LENGTH, "length before context"
    assert _feed(_rules(max_tokens=5)[0], _ids("ab"), full_after=2) == CONTEXT


def test_the_end_of_generation_token_is_not_part_of_the_text():
    rules, sent = _rules()
    assert _feed(rules, [*_ids("hi"), EOS_ID]) == EOS
    assert "".join(sent) == "hi" == rules.text and rules.ids[-1] == EOS_ID


def test_an_incomplete_character_is_streamed_only_once_whole():
    sent: list[str] = []
    rules = StopRules(set(), 10, lambda ids: bytes(ids).decode("utf-8", "replace"), on_text=sent.append)
    first, second = "é".encode()
    assert rules.take(ord("a"), False) is None and rules.take(first, False) is None
    assert sent == ["a"], "half a character is not sent"
    assert rules.take(second, False) is None and sent == ["a", "é"]


def test_stop_sequences_need_a_decoder():
    with pytest.raises(ValueError, match="stop sequences need the tokenizer's decode"):
        StopRules({EOS_ID}, 5, None, ["END"])


# -- the step-wise generator on the tiny model --------------------------------------------------
@pytest.fixture
def loaded(tiny_model, store):
    from slm.ops.store.importing import import_base
    from slm.ops.infer.loading import load_base_model

    import_base(store, tiny_model["gguf_q"], "tq")
    return load_base_model(store, "tq")


PROMPTS = [[5, 17, 42, 99, 3], [7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]


def _sequence(model, prompt, max_tokens=6, processors=()):
    stops = StopRules(frozenset(), max_tokens)
    return new_sequence(model, prompt, Sampler(), stops, len(prompt) + max_tokens, processors)


def _prefill(seq, chunk=PREFILL_CHUNK):
    logits = None
    while logits is None:
        logits = prefill_next(seq, chunk)
    return logits


def test_a_decoder_and_a_batch_both_give_every_name_rows_declares(loaded):
    """slm.model.block runs on either: each must answer every name of the Rows interface."""
    from slm.model.batch import BatchRows, Row
    from slm.model.block import Rows

    model = loaded.model
    declared = set(Rows.__annotations__) | {n for n in vars(Rows) if not n.startswith("_")}
    assert {"cfg", "t", "vectors", "q_scale", "kernels", "linear", "linears", "attention"} <= declared
    batch = BatchRows([Row(model, model.new_cache(4), 1), Row(model, model.new_cache(4), 2)], model.kernels)
    for rows in (model, batch):
        assert [n for n in sorted(declared) if not hasattr(rows, n)] == [], type(rows).__name__


def test_generate_is_the_step_wise_core_as_a_batch_of_one(loaded):
    model = loaded.model
    alone = generate(model, PROMPTS[0], 6, Sampler(), frozenset())
    seq = _sequence(model, PROMPTS[0])
    first_token(seq, _prefill(seq, chunk=2))  # in chunks of 2 positions: the prompt takes 3 turns
    while not seq.done:
        assert decode([seq], model.kernels) == [None]
    assert seq.ids == alone.ids and len(alone.ids) == 6 and seq.reason == alone.stop_reason == LENGTH


def test_generate_ends_at_a_stop_sequence_and_streams_the_text_before_it(loaded):
    model, decode_text = loaded.model, loaded.tokenizer.decode
    full = generate(model, PROMPTS[0], 12, Sampler(), frozenset())
    text = decode_text(full.ids)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip() and "\ufffd" not in stop, text
    pieces: list[str] = []
    gen = generate(model, PROMPTS[0], 12, Sampler(), frozenset(), decode_text=decode_text, on_text=pieces.append,
                   stop_sequences=(stop,))
    assert gen.stop_reason == STOP and "".join(pieces) == text[:text.find(stop)]
    assert gen.ids == full.ids[:len(gen.ids)] and len(gen.ids) < len(full.ids)
    assert stop in decode_text(gen.ids) and stop not in decode_text(gen.ids[:-1])


def test_sequences_decoded_together_answer_as_each_alone(loaded):
    from slm.model.kernels import default_kernels

    model = loaded.model
    alone = [generate(model, p, 6, Sampler(), frozenset()).ids for p in PROMPTS]
    seqs = [_sequence(model, p) for p in PROMPTS]
    for seq in seqs:
        first_token(seq, _prefill(seq))
    kernels = default_kernels()
    while not all(s.done for s in seqs):
        running = [s for s in seqs if not s.done]
        assert decode(running, kernels) == [None] * len(running)
    assert [s.ids for s in seqs] == alone


def test_a_logit_processor_sees_the_ids_so_far_and_shapes_the_next_token(loaded):
    model = loaded.model
    greedy = generate(model, PROMPTS[0], 3, Sampler(), frozenset()).ids
    seen: list[list[int]] = []

    def ban_greedy_first(ids: list[int], logits: np.ndarray) -> np.ndarray:
        seen.append(list(ids))
        if not ids:
            logits = logits.copy()
            logits[greedy[0]] = -np.inf
        return logits

    seq = _sequence(model, PROMPTS[0], max_tokens=3, processors=(ban_greedy_first,))
    logits = _prefill(seq)
    first_token(seq, logits)
    while not seq.done:
        decode([seq], model.kernels)
    runner_up = int(np.argsort(-logits, kind="stable")[1])
    assert seq.ids[0] == runner_up != greedy[0]
    assert seen == [[], seq.ids[:1], seq.ids[:2]]


def _nan_at_0(row: np.ndarray) -> None:
    row[0] = np.nan


def _all_zero(row: np.ndarray) -> None:
    row[:] = 0.0  # (what an overflow inside the network leaves: the norm's scale of an infinite sum of squares)


@pytest.mark.parametrize("damage", [_nan_at_0, pytest.param(_all_zero, marks=pytest.mark.hostile)],
                         ids=["non-finite", "all-equal"])
def test_a_bad_row_fails_its_sequence_alone(loaded, monkeypatch, damage):
    """A row of logits with a NaN, or with every logit the same (finite, and sampled as if it
    were an answer), is a NumericsError for that row alone."""
    model = loaded.model
    seqs = [_sequence(model, p) for p in PROMPTS]
    for seq in seqs:
        first_token(seq, _prefill(seq))
    real = generation.decode_step

    def second_row_goes_bad(rows, kernels):
        out = real(rows, kernels)
        damage(out[1])
        return out

    monkeypatch.setattr(generation, "decode_step", second_row_goes_bad)
    errors = decode(seqs, model.kernels)
    assert errors[0] is None and errors[2] is None and isinstance(errors[1], NumericsError)
    assert [len(s.ids) for s in seqs] == [2, 1, 2], "the failed row took no token"


@pytest.mark.hostile
def test_prompt_logits_all_equal_are_refused_before_sampling(loaded):
    seq = _sequence(loaded.model, PROMPTS[0])
    flat = np.full_like(_prefill(seq), -3.5)
    with pytest.raises(NumericsError, match="logits all equal"):
        first_token(seq, flat)
    assert seq.ids == []


def test_non_finite_prompt_logits_are_refused_before_sampling(loaded):
    seq = _sequence(loaded.model, PROMPTS[0])
    logits = _prefill(seq)
    logits[3] = np.inf
    with pytest.raises(NumericsError, match="non-finite logits"):
        first_token(seq, logits)
    assert seq.ids == []


# -- the prompt caches: one interface, two backends ---------------------------------------------
COMP_A, COMP_B = "blake3:" + "a" * 64, "blake3:" + "b" * 64


@pytest.fixture(params=["memory", "disk"])
def prompt_cache(request, tmp_path):
    return MemoryPromptCache() if request.param == "memory" else DiskPromptCache(tmp_path / "cache")


def _filled(model, prompt):
    cache = model.new_cache(len(prompt) + 4)
    return cache, model.forward(np.asarray(prompt), cache, "last")[-1]


def test_both_prompt_caches_keep_the_same_contract(loaded, prompt_cache):
    """An entry comes back, keys and values and logits bit for bit, only for its composition
    and its exact prompt; a miss leaves the cache empty."""
    model = loaded.model
    cache, logits = _filled(model, PROMPTS[0])
    prompt_cache.put(COMP_A, PROMPTS[0], cache, logits)
    for comp, tokens in ((COMP_B, PROMPTS[0]), (COMP_A, PROMPTS[0][:-1]), (COMP_A, PROMPTS[1])):
        empty = model.new_cache(16)
        assert prompt_cache.get(comp, tokens, empty) is None and empty.length == 0
    restored = model.new_cache(len(PROMPTS[0]) + 4)
    assert prompt_cache.get(COMP_A, PROMPTS[0], restored).tobytes() == logits.tobytes()
    assert restored.length == len(PROMPTS[0])
    assert all(restored.state()[k].tobytes() == v.tobytes() for k, v in cache.state().items())
    nxt = [model.forward(np.asarray([7]), c, "last") for c in (restored, cache)]
    assert nxt[0].tobytes() == nxt[1].tobytes()


def _entries(root):
    return sorted((root / "prefix").glob("*/*.npz"))


def test_a_disk_entry_larger_than_the_budget_is_not_written(loaded, tmp_path):
    model = loaded.model
    cache, logits = _filled(model, PROMPTS[2])
    probe = DiskPromptCache(tmp_path / "probe")
    probe.put(COMP_A, PROMPTS[2], cache, logits)
    size = _entries(tmp_path / "probe")[0].stat().st_size
    tight = DiskPromptCache(tmp_path / "cache", max_bytes=size - 1)
    tight.put(COMP_A, PROMPTS[2], cache, logits)
    assert _entries(tmp_path / "cache") == [] and tight.get(COMP_A, PROMPTS[2], model.new_cache(16)) is None
    DiskPromptCache(tmp_path / "cache", max_bytes=size).put(COMP_A, PROMPTS[2], cache, logits)
    assert len(_entries(tmp_path / "cache")) == 1, "an entry of exactly the budget is kept"


def test_the_oldest_disk_entries_go_across_compositions_when_the_total_passes_the_budget(loaded, tmp_path):
    import os

    model = loaded.model
    filled = [_filled(model, p) for p in PROMPTS[:2]]
    probe = DiskPromptCache(tmp_path / "probe")
    for p, (cache, logits) in zip(PROMPTS, filled):
        probe.put(COMP_A, p, cache, logits)
    biggest = max(e.stat().st_size for e in _entries(tmp_path / "probe"))
    disk = DiskPromptCache(tmp_path / "cache", max_bytes=2 * biggest + biggest // 2)  # room for two
    writes = [(COMP_A, PROMPTS[0], *filled[0]), (COMP_B, PROMPTS[1], *filled[1]), (COMP_B, PROMPTS[0], *filled[0])]
    for n, (comp, prompt, cache, logits) in enumerate(writes):
        before = set(_entries(tmp_path / "cache"))
        disk.put(comp, prompt, cache, logits)
        (written,) = set(_entries(tmp_path / "cache")) - before
        os.utime(written, ns=(10**12 * (n + 1), 10**12 * (n + 1)))  # aged in write order (a coarse clock can tie)
    left = {(c, tuple(p)) for c, p, *_ in writes if disk.get(c, p, model.new_cache(16)) is not None}
    assert left == {(COMP_B, tuple(PROMPTS[1])), (COMP_B, tuple(PROMPTS[0]))}, "composition A's, the oldest, went"
    assert sum(e.stat().st_size for e in _entries(tmp_path / "cache")) <= disk.max_bytes


@pytest.mark.parametrize("value, expected", [('"1G"', 1 << 30), ('"512M"', 512 << 20), ("0", 0), ("4096", 4096)])
def test_the_prompt_cache_budget_is_read_from_config(value, expected):
    import tomllib

    from slm.store.config import check_config

    doc = tomllib.loads(f"format = 1\n[cache]\nprompt_bytes = {value}\n")
    check_config(doc)
    assert budget_of(doc) == expected


def test_the_prompt_cache_budget_defaults_to_one_gib():
    assert budget_of({"format": 1}) == 1 << 30


@pytest.mark.parametrize("value", ['"lots"', "-1", "1.5", "true"])
def test_a_bad_prompt_cache_budget_is_refused_with_exit_4_and_nothing_written(cli, tiny_model, tmp_path, value):
    from helpers import tiny_store

    store = tiny_store(tmp_path, tiny_model)
    config = store / "config.toml"
    config.write_text(config.read_text() + f"\n[cache]\nprompt_bytes = {value}\n")
    before = snapshot(store)
    r = cli("--store", str(store), "run", "hello", "-n", "2")
    assert r.code == 4 and one_line(r.err) and "prompt_bytes" in r.err, r.err
    assert snapshot(store) == before


def test_a_zero_prompt_cache_budget_keeps_no_entry(cli, tiny_model, tmp_path):
    from helpers import tiny_store

    store = tiny_store(tmp_path, tiny_model)
    config = store / "config.toml"
    config.write_text(config.read_text() + "\n[cache]\nprompt_bytes = 0\n")
    for _ in range(2):
        r = cli("--store", str(store), "run", "hello", "-n", "2", "--json")
        assert r.code == 0 and r.json()["prefix_cache"] == "miss", r.err
    assert _entries(store / "cache") == []


def test_budget_of_names_the_key_in_its_refusal():
    with pytest.raises(InvalidInput, match=r"cache\.prompt_bytes must be a size"):
        budget_of({"cache": {"prompt_bytes": "many"}})
