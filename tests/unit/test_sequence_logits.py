"""Session.logits's rows are a generation's rows (issue 31: logprobs equal log-softmax of
Session.logits in the default int8 mode too). slm.engine.generate.sequence_logits computes a
prompt in generate's prefill chunks and the answer one decode step a token; a pass that keeps
every row's logits gives its last row the bits of a last-row-only pass (the row the first
token is sampled from), though a product over many rows may take other kernels (BLAS for a
Q8_0 head over more than 32 rows)."""

from __future__ import annotations

import numpy as np
import pytest

from slm.engine import generate as generation
from slm.model import kernels_native
from slm.engine.sampling import Sampler

pytestmark = pytest.mark.skipif(not kernels_native.available(), reason="C kernels not built")
gguf = pytest.importorskip("gguf")
from test_step import VOCAB, _model  # noqa: E402

MODES = ("int8", "float32")


def _base(activations: str, ggml_type=gguf.GGMLQuantizationType.Q4_1):
    model = _model("llama", ggml_type, seed=3)
    model.kernels.set_activations(activations)
    return model


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("length", [2, 31, 33, 60])
def test_the_last_row_of_every_rows_logits_is_the_last_row_only_pass(activations, length):
    model = _base(activations)
    ids = np.random.default_rng(length).integers(0, VOCAB, length)
    every = model.forward(ids, model.new_cache(length), "all")
    alone = model.forward(ids, model.new_cache(length), "last")
    assert every.shape == (length, VOCAB) and alone.shape == (1, VOCAB)
    assert every[-1].tobytes() == alone[0].tobytes()


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("prompt_length", [5, 40])
def test_sequence_logits_are_the_rows_a_generation_sampled_from(activations, prompt_length, monkeypatch):
    """A greedy generation's logits (every prompt row, then each step's) equal sequence_logits
    of its prompt and answer bit for bit; with small prefill chunks, so that a chunk boundary
    falls inside the 40-token prompt."""
    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)
    model = _base(activations)
    prompt = np.random.default_rng(prompt_length).integers(0, VOCAB, prompt_length).tolist()
    gen = generation.generate(model, prompt, 12, Sampler(0.0, 1.0, 0), frozenset(), keep_logits=True)
    rows = generation.sequence_logits(model, np.asarray(prompt + gen.ids), prompt_length)
    kept = np.stack(gen.logits)  # every prompt row, then one per step (the last token's row: not computed)
    assert kept.shape[0] == prompt_length + len(gen.ids) - 1
    assert rows[:-1].tobytes() == kept.tobytes()
    # and the rows of a generation that kept none (its logprobs' rows): the same bits
    plain = generation.generate(model, prompt, 12, Sampler(0.0, 1.0, 0), frozenset(), logprobs=0)
    assert plain.ids == gen.ids
    for i, record in enumerate(plain.logprobs):
        row = rows[prompt_length - 1 + i].astype(np.float64)
        shifted = row - row.max()
        assert record.logprob == float((shifted - np.log(np.exp(shifted).sum()))[record.token])


def test_sequence_logits_without_a_prompt_length_is_the_whole_sequence_as_a_prompt(monkeypatch):
    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)
    model = _base("int8")
    ids = np.random.default_rng(9).integers(0, VOCAB, 40)
    cache = model.new_cache(40)
    chunks = [model.forward(ids[s:s + 16], cache, "all") for s in range(0, 40, 16)]
    assert generation.sequence_logits(model, ids).tobytes() == np.concatenate(chunks).tobytes()
