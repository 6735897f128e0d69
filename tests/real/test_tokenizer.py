"""SentencePiece GGUF vocabularies (tokenizer.ggml.model = llama) on a tiny hand-made vocabulary.

First the rules of llama.cpp's SPM tokenizer one at a time (fast, no model), then the same
vocabulary written as a GGUF file and tokenized by llama.cpp itself (oracle): the add_space_prefix
= True path, which neither real test model (Gemma 3: False, SmolLM2: byte-level BPE) exercises.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slm.errors import InvalidInput
from slm.formats.gguf import read_gguf
from slm.formats.gguf_model import tokenizer_doc_from_gguf
from slm.model.tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, load_tokenizer
from tokenizer_corpus import LlamaCppVocab, corpus

# (text, GGUF token type, score). Scores decide the merge order: "cd" beats "bc", "ab" and "bc"
# tie (the leftmost pair merges first), "▁ab" only forms after "ab".
VOCAB = [
    ("<unk>", UNKNOWN, 0.0), ("<s>", CONTROL, 0.0), ("</s>", CONTROL, 0.0),
    ("<start_of_turn>", CONTROL, 0.0), ("<end_of_turn>", CONTROL, 0.0),
    ("<b>", USER_DEFINED, 0.0), ("\n", USER_DEFINED, 0.0), ("<unused0>", UNUSED, 0.0),
    *[(f"<0x{b:02X}>", BYTE, 0.0) for b in range(256)],
    ("\u2581", NORMAL, -1.0), ("a", NORMAL, -2.0), ("b", NORMAL, -3.0), ("c", NORMAL, -4.0),
    ("d", NORMAL, -4.5), ("ab", NORMAL, -5.0), ("bc", NORMAL, -5.0), ("cd", NORMAL, -1.5),
    ("\u2581a", NORMAL, -6.0), ("\u2581ab", NORMAL, -7.0),
]
ID = {text: i for i, (text, _, _) in enumerate(VOCAB)}


def fields(**flags) -> dict:
    """The tokenizer.* metadata of a GGUF with VOCAB, as slm stores it (key -> value)."""
    f = {"ggml.model": "llama", "ggml.tokens": [t for t, _, _ in VOCAB],
         "ggml.token_type": [ty for _, ty, _ in VOCAB], "ggml.scores": [s for _, _, s in VOCAB],
         "ggml.bos_token_id": ID["<s>"], "ggml.eos_token_id": ID["</s>"],
         "ggml.unknown_token_id": ID["<unk>"]}
    f.update({f"ggml.{k}": v for k, v in flags.items()})
    return f


def tokenizer(**flags):
    return load_tokenizer(json.dumps({"source": "gguf", "fields": fields(**flags)}).encode())


def byte(b: int) -> int:
    return ID[f"<0x{b:02X}>"]


def test_merges_by_score_leftmost_first_on_ties():
    tok = tokenizer(add_space_prefix=False)
    assert tok.encode("abc", add_special=False) == [ID["ab"], ID["c"]]  # ab and bc tie
    assert tok.encode("bcd", add_special=False) == [ID["b"], ID["cd"]]  # cd scores higher


def test_byte_fallback_for_characters_outside_the_vocabulary():
    tok = tokenizer(add_space_prefix=False)
    assert tok.encode("z", add_special=False) == [byte(0x7A)]
    assert tok.encode("aé", add_special=False) == [ID["a"], byte(0xC3), byte(0xA9)]
    assert tok.decode(tok.encode("é😀z", add_special=False)) == "é😀z"
    assert tok.decode([byte(0xC3)]) == "\ufffd"  # half a character


@pytest.mark.parametrize("prefix", [True, False])
def test_add_space_prefix(prefix):
    tok = tokenizer(add_space_prefix=prefix)
    ids = tok.encode("ab", add_special=False)
    assert ids == ([ID["\u2581ab"]] if prefix else [ID["ab"]])
    assert tok.decode(ids) == "ab"  # the prefix space is dropped again
    # llama.cpp prefixes every text fragment that follows a special token, too
    after = tok.encode("<start_of_turn>ab", add_special=False)
    assert after == [ID["<start_of_turn>"], ID["\u2581ab" if prefix else "ab"]]


def test_space_prefix_is_llama_cpp_default_for_sentencepiece():
    assert tokenizer().encode("ab", add_special=False) == [ID["\u2581ab"]]


def test_spaces_become_u2581():
    tok = tokenizer(add_space_prefix=False)
    assert tok.encode(" ab", add_special=False) == [ID["\u2581ab"]]
    assert tok.encode("a b", add_special=False) == [ID["a"], ID["\u2581"], ID["b"]]


def test_control_tokens_parsed_only_on_request_and_dropped_in_decode():
    tok = tokenizer(add_space_prefix=False)
    ids = tok.encode("<start_of_turn>ab<end_of_turn>", add_special=False)
    assert ids == [ID["<start_of_turn>"], ID["ab"], ID["<end_of_turn>"]]
    assert tok.decode(ids) == "ab"
    assert tok.decode(ids, special=True) == "<start_of_turn>ab<end_of_turn>"
    plain = tok.encode("<start_of_turn>", add_special=False, parse_special=False)
    assert plain == [ID[c] if c in ID else byte(ord(c)) for c in "<start_of_turn>"]  # no pair merges
    assert tok.encode("<unk>", add_special=False) == [ID["<unk>"]]  # unknown type: like control
    assert tok.decode([ID["<unk>"], ID["a"]]) == "a"


def test_user_defined_tokens_always_matched_and_decoded_as_written():
    tok = tokenizer(add_space_prefix=False)
    ids = tok.encode("a<b>b\n", add_special=False, parse_special=False)
    assert ids == [ID["a"], ID["<b>"], ID["b"], ID["\n"]]
    assert tok.decode(ids) == "a<b>b\n"


def test_unused_tokens_are_not_special_and_decode_to_nothing():
    tok = tokenizer(add_space_prefix=False)
    assert ID["<unused0>"] not in tok.encode("<unused0>", add_special=False)
    assert tok.decode([ID["<unused0>"], ID["a"]]) == "a"


def test_add_bos_and_eos():
    assert tokenizer().encode("a")[0] == ID["<s>"]  # llama.cpp's default for SentencePiece
    assert tokenizer(add_bos_token=False).encode("a") == [ID["\u2581a"]]
    assert tokenizer().encode("a", add_special=False) == [ID["\u2581a"]]
    assert tokenizer(add_eos_token=True).encode("a") == [ID["<s>"], ID["\u2581a"], ID["</s>"]]


def test_text_starting_with_bos_gets_no_second_one():
    """A chat template writes BOS itself; llama.cpp's chat code strips it before tokenizing."""
    tok = tokenizer(add_space_prefix=False)
    assert tok.encode("<s>ab") == [ID["<s>"], ID["ab"]]
    assert tok.encode("ab<s>") == [ID["<s>"], ID["ab"], ID["<s>"]]


def test_end_of_generation_ids_by_key_and_by_text():
    tok = tokenizer()
    assert tok.eos_ids == {ID["</s>"], ID["<end_of_turn>"]}  # eos key; <end_of_turn> by its text
    assert tokenizer(eot_token_id=ID["<b>"]).eos_ids == {ID["</s>"], ID["<end_of_turn>"], ID["<b>"]}
    assert tok.special_tokens == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def test_bad_vocabularies_are_one_line_errors():
    f = fields()
    f["ggml.tokens"] = [*f["ggml.tokens"][:-1], "a"]  # a duplicate
    with pytest.raises(InvalidInput, match="duplicate"):
        load_tokenizer(json.dumps({"source": "gguf", "fields": f}).encode())
    with pytest.raises(InvalidInput, match="not supported"):
        load_tokenizer(json.dumps({"source": "gguf", "fields": fields(model="t5")}).encode())
    with pytest.raises(InvalidInput, match="surrogate"):
        tokenizer().encode("a\udcff")
    f = fields()
    f["ggml.scores"] = f["ggml.scores"][:-1]
    with pytest.raises(InvalidInput, match="scores"):
        load_tokenizer(json.dumps({"source": "gguf", "fields": f}).encode())


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\u2581"),
                    max_size=40),
       prefix=st.booleans())
def test_decode_inverts_encode(text, prefix):
    """Every character has a piece or byte tokens, so any text survives (control-token spellings
    stay text when special tokens are not parsed). With the space prefix, a text fragment after a
    user-defined token keeps its prefix space in llama.cpp too, so those texts are left out. U+2581
    is left out as well: it is SentencePiece's spelling of a space, so a literal one decodes as a
    space, in llama.cpp too (HAND below compares "\u2581ab" with it)."""
    while prefix and ("\n" in text or "<b>" in text):
        text = text.replace("\n", "").replace("<b>", "")
    tok = tokenizer(add_space_prefix=prefix)
    assert tok.decode(tok.encode(text, add_special=False, parse_special=False)) == text


# ------------------------------------------------------------------------------------------
# llama.cpp on the same vocabulary
# ------------------------------------------------------------------------------------------
HAND = ["ab", " ab", "abc", "bcd", "a b  c", "<s>ab", "<start_of_turn>ab<end_of_turn>\nab",
        "a<b>b", "<unk><unused0>", "é😀z", "\u2581ab", "<0x41>", "   ", "\n\nab\n"]


def write_gguf(path, flags: dict, model: str = "llama") -> None:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    # the hyper-parameters llama.cpp reads even with vocab_only
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    f = fields(**flags)
    w.add_tokenizer_model(model)
    w.add_token_list(f["ggml.tokens"])
    w.add_token_types(f["ggml.token_type"])
    w.add_token_scores(f["ggml.scores"])
    w.add_bos_token_id(f["ggml.bos_token_id"])
    w.add_eos_token_id(f["ggml.eos_token_id"])
    w.add_unk_token_id(f["ggml.unknown_token_id"])
    w.add_add_space_prefix(flags["add_space_prefix"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_import_stores_sentencepiece_and_refuses_other_models(tmp_path):
    write_gguf(tmp_path / "spm.gguf", {"add_space_prefix": False})
    g = read_gguf(tmp_path / "spm.gguf")
    doc = tokenizer_doc_from_gguf(g)
    g.close()
    assert json.loads(doc)["architecture"] == "llama"  # picks a fallback chat template, if any
    assert load_tokenizer(doc).encode("ab", add_special=False) == [ID["ab"]]
    write_gguf(tmp_path / "t5.gguf", {"add_space_prefix": False}, model="t5")
    g = read_gguf(tmp_path / "t5.gguf")
    with pytest.raises(InvalidInput, match="tokenizer model 't5' is not supported"):
        tokenizer_doc_from_gguf(g)
    g.close()


@pytest.mark.oracle
@pytest.mark.parametrize("prefix", [True, False])
def test_ids_and_text_match_llama_cpp(tmp_path, prefix):
    pytest.importorskip("llama_cpp")
    write_gguf(tmp_path / "tiny.gguf", {"add_space_prefix": prefix})
    ref = LlamaCppVocab(tmp_path / "tiny.gguf")
    tok = tokenizer(add_space_prefix=prefix)
    for text in HAND + corpus(300, seed=7):
        for parse_special in (True, False):
            ids = tok.encode(text, add_special=False, parse_special=parse_special)
            assert ids == ref.tokenize(text, False, parse_special), (text, parse_special)
            for special in (True, False):
                assert tok.decode(ids, special=special) == ref.detokenize(ids, special), (text, special)


def _stream_matches_decode(tok, ids) -> None:
    """TextStream's text after every token is decode(ids so far), bit for bit."""
    from slm.engine.detokenize import TextStream

    stream = TextStream(tok.decode)
    for i, token in enumerate(ids):
        assert stream.push(token) == tok.decode(ids[:i + 1]), (i, ids[max(0, i - 6):i + 1])


@pytest.mark.parametrize("prefix", [True, False])
def test_text_stream_equals_decode_on_the_small_vocabulary(prefix):
    """Byte tokens splitting characters (the 4-byte emoji across windows), a leading space the
    vocabulary drops, control, user-defined and unused tokens."""
    import random

    tok = tokenizer(add_space_prefix=prefix)
    emoji = [byte(b) for b in "\U0001f600".encode()]
    rng = random.Random(7)
    ids = [ID["\u2581ab"], *emoji, ID["\u2581a"], *emoji[:2], ID["cd"], *emoji[2:], ID["<s>"], ID["<b>"]]
    ids += [rng.randrange(len(VOCAB)) for _ in range(400)] + emoji * 3
    _stream_matches_decode(tok, ids)


@pytest.mark.real_model
@pytest.mark.parametrize("which", ["gemma3", "smollm2"])
def test_text_stream_equals_decode_on_real_vocabularies(which, request):
    """Random ids over the whole vocabulary (Gemma 3's byte tokens and SentencePiece spaces,
    SmolLM2's byte-level BPE pieces that are parts of characters), and the text of a real
    sentence, token by token."""
    import random

    from tokenizer_corpus import corpus, gemma3_gguf, slm_tokenizer

    path = gemma3_gguf() if which == "gemma3" else request.getfixturevalue("smollm2_gguf")
    tok, _ = slm_tokenizer(path)
    rng = random.Random(11)
    _stream_matches_decode(tok, [rng.randrange(tok.vocab_size) for _ in range(1500)])
    _stream_matches_decode(tok, tok.encode(" ".join(corpus(40, seed=5)), add_special=False))


def test_text_stream_decodes_everything_when_a_token_changes_the_text_before_it():
    """A decoder that tidies " ." into "." (as Hugging Face's clean-up does) changes the settled
    text when the "." comes: the window's text no longer begins with its head's, and the stream
    falls back to decoding the whole list."""
    pieces = ["Hello", " ", "world", " ", ".", " ", "!", " again", " ", " ", "."]

    def tidy(ids):
        return "".join(pieces[i] for i in ids).replace(" .", ".")

    class Tidy:
        decode = staticmethod(tidy)

    _stream_matches_decode(Tidy, list(range(len(pieces))))
