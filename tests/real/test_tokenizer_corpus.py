"""Token ids identical to llama.cpp's on real GGUF vocabularies: Gemma 3's SentencePiece (262,144
pieces with scores, byte tokens, no space prefix) and SmolLM2's byte-level BPE, over the 1,000
strings of tests/real/tokenizer_corpus.py; decoding equal to llama.cpp's llama_detokenize; the same
end-of-generation tokens. Run with -s to see the counts.
"""

from __future__ import annotations

import sys

import pytest

from tokenizer_corpus import LlamaCppVocab, corpus, gemma3_gguf, slm_tokenizer

pytestmark = [pytest.mark.real_model, pytest.mark.oracle]

CORPUS = corpus(1000, seed=1234)


@pytest.fixture(scope="module", params=["gemma3", "smollm2"])
def pair(request):
    """(name, our tokenizer as import stores and run loads it, llama.cpp on the same file)."""
    pytest.importorskip("llama_cpp")
    path = gemma3_gguf() if request.param == "gemma3" else request.getfixturevalue("smollm2_gguf")
    tok, seconds = slm_tokenizer(path)
    print(f"\n{request.param}: tokenizer loaded in {seconds:.3f} s", file=sys.stderr)
    return request.param, tok, LlamaCppVocab(path)


@pytest.mark.parametrize("parse_special", [True, False])
def test_ids_match_llama_cpp(pair, parse_special):
    name, tok, ref = pair
    compared = 0
    mismatched = []
    for text in CORPUS:
        want = ref.tokenize(text, False, parse_special)
        compared += len(want)
        if tok.encode(text, add_special=False, parse_special=parse_special) != want:
            mismatched.append(text)
    print(f"\n{name} parse_special={parse_special}: {len(CORPUS)} strings, {compared} tokens, "
          f"{len(mismatched)} mismatches", file=sys.stderr)
    assert not mismatched, mismatched[:5]


def test_bos_and_eos_added_like_llama_cpp(pair):
    """Same ids with add_special, except where the text starts with BOS itself: llama.cpp adds a
    second one, slm does not (see TextTokenizer.encode)."""
    name, tok, ref = pair
    starts_with_bos = 0
    for text in CORPUS:
        ours, want = tok.encode(text), ref.tokenize(text, True, True)
        if tok.add_bos and tok.encode(text, add_special=False)[:1] == [tok.bos_id]:
            starts_with_bos += 1
            assert want[:2] == [tok.bos_id] * 2 and ours == want[1:], text
        else:
            assert ours == want, text
    print(f"\n{name}: add_bos={tok.add_bos}, {starts_with_bos} texts start with BOS", file=sys.stderr)


@pytest.mark.parametrize("special", [True, False])
def test_decode_matches_llama_detokenize(pair, special):
    name, tok, ref = pair
    round_trips = 0
    for text in CORPUS:
        ids = ref.tokenize(text, False, True)
        decoded = tok.decode(ids, special=special)
        assert decoded == ref.detokenize(ids, special), text
        round_trips += decoded == text
    print(f"\n{name} special={special}: decode equals llama_detokenize on {len(CORPUS)} strings; "
          f"{round_trips} round-trip to the original text", file=sys.stderr)
    if special:  # every token's text is kept: only llama.cpp's own lossy cases may differ
        assert round_trips >= 0.99 * len(CORPUS)


def test_end_of_generation_ids_match_llama_cpp(pair):
    name, tok, ref = pair
    assert tok.eos_ids == ref.eog_ids()
    if name == "gemma3":  # no EOT key in the file: llama.cpp finds <end_of_turn> by its text
        assert tok.codec.pieces[106] == "<end_of_turn>" and 106 in tok.eos_ids


def test_gemma3_vocabulary_facts():
    tok, _ = slm_tokenizer(gemma3_gguf())
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.add_bos) == (262144, 2, 1, True)
    assert not tok.codec.add_space_prefix
    assert tok.chat_template and "<start_of_turn>" in tok.chat_template  # the fallback
