"""The grammar mask (slm.engine.grammar.GrammarMask), which allocates nothing per token: at every
step its row is the logits where llguidance allows the token and -inf elsewhere, the input row
is left as it was (the logprobs are computed from it), and two rows' masks never mix."""

from __future__ import annotations

import numpy as np
import pytest

import slm
from helpers import tiny_store

pytest.importorskip("llguidance")
from slm.engine.grammar import GrammarMask, compile_grammar, json_schema_grammar  # noqa: E402

SCHEMA = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "name": {"type": "string",
                                                                                     "maxLength": 8}},
          "required": ["kind", "name"], "additionalProperties": False}


def _allowed(mask: GrammarMask, vocab: int) -> np.ndarray:
    """llguidance's own answer for the matcher's state: its bitmask as a bool per token."""
    bits = np.unpackbits(np.frombuffer(mask.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    return bits[:vocab].astype(bool)


def test_each_step_keeps_the_allowed_logits_and_bans_the_rest(tmp_path, tiny_model):
    store = slm.Store.open(tiny_store(tmp_path, tiny_model))
    tok = store.tokenizer("tq")
    vocab = tok.vocab_size
    grammar = compile_grammar(tok, json_schema_grammar(SCHEMA), vocab)
    first, second = GrammarMask(tok, grammar, vocab), GrammarMask(tok, grammar, vocab)
    rng = np.random.default_rng(0)
    ids_a: list[int] = []
    ids_b: list[int] = []
    for step in range(12):
        logits = rng.standard_normal(vocab).astype(np.float32)
        before = logits.copy()
        row_a = first(ids_a, logits).copy()  # (the mask returns its own buffer: keep this step's)
        allowed = _allowed(first, vocab)
        assert allowed.any()
        assert np.array_equal(row_a[allowed], logits[allowed]) and np.all(row_a[~allowed] == -np.inf)
        assert np.array_equal(logits, before)  # the model's own row is untouched
        token_a = int(np.argmax(row_a))
        row_b = second(ids_b, logits[::-1].copy())  # another row (its least likely allowed token each step)
        allowed_b = _allowed(second, vocab)
        assert np.array_equal(row_b[allowed_b], logits[::-1][allowed_b]) and np.all(row_b[~allowed_b] == -np.inf)
        token_b = int(np.argmin(np.where(np.isfinite(row_b), row_b, np.inf)))
        # the first row's mask still answers for its own state after the second row's call
        assert np.array_equal(first(ids_a, logits), row_a) and np.all(np.isfinite(row_a[[token_a]]))
        ids_a.append(token_a)
        ids_b.append(token_b)
        if first.complete or second.complete:
            break
    assert len(ids_a) >= 5
