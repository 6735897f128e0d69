"""The sampling options beyond temperature/top_p/seed (issue 31): the penalties and the bias as
logit processors (slm.engine.processors), top_k and min_p in the Sampler, fresh random seeds,
the seeds of n choices, and the one check of every option (slm.engine.sampling)."""

from __future__ import annotations

import numpy as np
import pytest

from slm.errors import InvalidInput
from slm.engine.generation import token_logprob
from slm.engine.processors import FrequencyPresence, LogitBias, RepeatPenalty, processors_for
from slm.engine.sampling import MAX_SEED, Sampler, check_processing, check_sampling, choice_seeds, random_seed


def test_frequency_and_presence_penalties_follow_openais_definition():
    logits = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    out = FrequencyPresence(frequency=0.5, presence=0.25)([2, 2, 2, 0], logits)
    # token 2 seen 3 times: 3 - 3*0.5 - 0.25; token 0 once: 1 - 0.5 - 0.25; the others untouched
    np.testing.assert_allclose(out, [0.25, 2.0, 1.25, 4.0])
    assert logits.tolist() == [1.0, 2.0, 3.0, 4.0]  # the model's row is not changed in place


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = np.array([2.0, -2.0, 3.0, -1.0], dtype=np.float32)
    out = RepeatPenalty(2.0)([0, 1, 1], logits)
    np.testing.assert_allclose(out, [1.0, -4.0, 3.0, -1.0])


def test_logit_bias_adds_and_minus_100_bans_the_token():
    logits = np.array([5.0, 1.0, 0.0], dtype=np.float32)
    out = LogitBias([(0, -100.0), (2, 7.5)])([], logits)
    assert out[0] == -np.inf and out[1] == 1.0 and out[2] == 7.5
    assert Sampler(0.0)(out) == 2  # greedy takes the biased token
    sampler = Sampler(1.0, seed=3)
    assert 0 not in {sampler(out) for _ in range(200)}  # a banned token is never sampled


def test_no_option_set_means_no_processor():
    assert processors_for() == ()
    kinds = [type(p) for p in processors_for(0.1, 0.0, 1.1, [(1, 2.0)])]
    assert kinds == [RepeatPenalty, FrequencyPresence, LogitBias]


def test_top_k_samples_only_among_the_k_most_likely():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    sampler = Sampler(1.0, seed=1, top_k=2)
    assert {sampler(logits) for _ in range(300)} == {0, 1}


def test_min_p_drops_tokens_under_that_fraction_of_the_top_probability():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    sampler = Sampler(1.0, seed=1, min_p=0.25)  # keeps p >= 0.125
    assert {sampler(logits) for _ in range(300)} == {0, 1, 2}


def test_filters_off_leave_the_seeded_draws_as_they_were():
    """top_k 0 and min_p 0 change nothing: a seed gives the draws it gave before they existed."""
    logits = np.random.default_rng(0).normal(size=50)
    plain = Sampler(0.8, 0.9, 42)
    filtered = Sampler(0.8, 0.9, 42, top_k=0, min_p=0.0)
    assert [plain(logits) for _ in range(50)] == [filtered(logits) for _ in range(50)]


def test_no_seed_draws_a_fresh_one_and_reports_it():
    seeds = {Sampler(1.0, seed=None).seed for _ in range(3)}
    assert len(seeds) == 3 and all(0 <= s <= MAX_SEED for s in seeds)
    assert 0 <= random_seed() <= MAX_SEED
    logits = np.random.default_rng(1).normal(size=200)
    first = Sampler(1.0, seed=None)
    again = Sampler(1.0, seed=first.seed)  # the reported seed reproduces the draws
    assert [first(logits) for _ in range(20)] == [again(logits) for _ in range(20)]


def test_choice_i_of_a_seeded_request_uses_seed_plus_i():
    assert choice_seeds(7, 4) == (7, 8, 9, 10)
    assert len(set(choice_seeds(None, 4))) == 4
    with pytest.raises(InvalidInput, match="passes"):
        choice_seeds(MAX_SEED, 2)


@pytest.mark.parametrize("options, message", [
    ({"top_k": -1}, "top_k must be an integer >= 0"),
    ({"top_k": 2.5}, "top_k must be an integer >= 0"),
    ({"min_p": 1.5}, r"min_p must be a number in \[0, 1\]"),
    ({"frequency_penalty": 2.5}, "frequency_penalty must be a number between -2 and 2"),
    ({"presence_penalty": -3}, "presence_penalty must be a number between -2 and 2"),
    ({"repeat_penalty": 0}, "repeat_penalty must be a finite number > 0"),
    ({"repeat_penalty": float("inf")}, "repeat_penalty must be a finite number > 0"),
    ({"logit_bias": {"x": 1}}, "logit_bias: 'x' is not a token id"),
    ({"logit_bias": {"5": 101}}, r"logit_bias\[5\] must be a number between -100 and 100"),
    ({"logit_bias": {"99": 1}, "vocab_size": 99}, "logit_bias: '99' is not a token id .* below 99"),
    ({"logit_bias": [1, 2]}, "logit_bias must be an object"),
    ({"logit_bias": {0: -100, "1": -100}, "vocab_size": 2}, "logit_bias bans every token"),
    ({"logprobs": 21}, "logprobs must be an integer between 0 and 20"),
    ({"n": 0}, "n must be an integer >= 1"),
    ({"n": 9, "max_n": 8}, "n is 9; this server decodes at most 8"),
])
def test_each_bad_option_is_refused_naming_it(options, message):
    with pytest.raises(InvalidInput, match=message):
        check_processing(**options)


def test_good_options_pass_and_a_seed_may_be_none():
    check_processing(top_k=40, min_p=0.05, frequency_penalty=-2, presence_penalty=2, repeat_penalty=1.3,
                     logit_bias={"5": -100, 7: 100}, logprobs=20, n=8, max_n=8, vocab_size=8)
    check_sampling(1.0, 1.0, None)
    with pytest.raises(InvalidInput, match="seed must be an integer"):
        check_sampling(1.0, 1.0, -1)


def test_token_logprob_is_the_float64_log_softmax_with_the_k_most_likely():
    logits = np.array([1.0, 3.0, 2.0, 0.5], dtype=np.float32)
    want = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    record = token_logprob(logits, 2, 3)
    assert record.token == 2 and record.logprob == pytest.approx(want[2], abs=1e-12)
    assert [t for t, _ in record.top] == [1, 2, 0]
    assert [lp for _, lp in record.top] == pytest.approx([want[1], want[2], want[0]], abs=1e-12)
    assert token_logprob(logits, 0, 0).top == ()
