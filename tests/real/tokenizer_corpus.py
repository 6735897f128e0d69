"""Awkward strings for tokenizer differential tests, generated deterministically, and the
llama.cpp reference they are checked against, and the real GGUF vocabularies to check.

corpus(n, seed) = the hand-picked strings below + random strings built from a fixed seed out of
pieces that trip tokenizers: runs of spaces/tabs/newlines, CRLF, scripts without spaces (CJK,
Thai), right-to-left and combining scripts (Arabic, Hindi), emoji with ZWJ sequences and skin
tones, combining accents, code, digits, long runs of one character and special-token lookalikes.
The same (n, seed) gives the same list in any process (random.Random, no hash-order dependence).
"""

from __future__ import annotations

import ctypes
import random

HAND_PICKED = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t\n\t", "a", " a", "a ", "  a  ",
    "Hello world", " Hello world", "Hello  world", "Hello   world ", "hello\tworld", "line1\nline2",
    "line1\r\nline2\r\n", "trailing spaces   ", "   leading spaces", "multiple     inner     spaces",
    "日本語のテキストです。", "中文分词测试，没有空格。", "한국어 텍스트", "ภาษาไทยไม่มีช่องว่าง",
    "مرحبا بالعالم", "السلام عليكم ورحمة الله", "नमस्ते दुनिया", "हिन्दी में लिखा गया पाठ",
    "👩‍👩‍👧‍👦", "👍🏽 👍🏿 👋🏻", "🏳️‍🌈 flags 🇩🇪🇯🇵", "e\u0301 vs \u00e9",
    "Zalgo: Z\u0351\u0352\u0353a\u0354l\u0355g\u0356o",
    "café naïve Zürich résumé", "Ångström ﬁ ligature ﬀ", "\u200b zero width \u200d joiner \ufeff bom",
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "<div class=\"x\">&amp; &lt;tag&gt;</div>", "SELECT * FROM t WHERE a = 'b';",
    "{\"key\": [1, 2.5, null]}",
    "1234567890", "3.14159265358979", "1,000,000.00", "0x1F 0b1010 1e-9", "2024-12-31T23:59:59Z",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "=" * 64, "-" * 33 + ">" , "!!!???...", "\\n is not a newline", "\x00 nul \x07 bell \x1b[31m",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<start_of_turn>", "<end_of_turn>",
    "<bos>text", "text<eos>", "<pad><unk><mask>", "<start_of_turn <end_of_turn>>", "<<start_of_turn>>",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>", "<|endoftext|>",
    "<|im_start|<|im_end|>>", "<0x41><0xFF>", "<unused0> <unused12>", "[multimodal]", "<s></s>",
    "<table><tr><td>cell</td></tr></table>", "<h1>Title</h1>", "▁already▁escaped▁", "▁", "▁▁ ▁",
    "I'm you're it's we'll they'd", "DON'T SHOUT", "don't   stop", "U.S.A. e.g. i.e.",
]

_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Tokenizer",
          "unbelievable", "internationalization", "GGUF", "llama.cpp", "naïve", "façade", "straße",
          "Москва", "Ελληνικά", "東京", "北京市", "こんにちは", "안녕하세요", "สวัสดี", "שלום", "مرحبا",
          "नमस्ते", "বাংলা", "தமிழ்"]
_SPACES = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u3000"]
_SYMBOLS = [*"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "...", "—", "–", "«", "»", "“", "”", "€", "£", "©"]
_EMOJI = ["😀", "🤖", "👩‍💻", "👨‍👩‍👧", "👍🏽", "🏳️‍⚧️", "❤️", "🇺🇸", "🧑🏿‍🚀", "🙂‍↔️", "✋🏻", "🫠"]
_COMBINING = ["\u0301", "\u0308", "\u0327", "\u0323", "\u20dd", "\u034f"]
_CODE = ["def main():", "return None", "x += 1;", "if (a && b) {", "}", "#include <stdio.h>",
         "print(f'{x!r}')", "lambda x: x", "=>", "!==", "::", "->", "/* comment */", "// TODO",
         "0xDEADBEEF"]
_SPECIAL = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
            "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_image>", "<unused7>", "<0x0A>",
            "<s>", "</s>", "<b>"]


def _piece(rng: random.Random) -> str:
    kind = rng.randrange(10)
    if kind <= 2:
        return rng.choice(_WORDS)
    if kind == 3:
        return rng.choice(_SPACES)
    if kind == 4:
        return rng.choice(_SYMBOLS)
    if kind == 5:
        return rng.choice(_EMOJI)
    if kind == 6:
        return rng.choice("aeiouny") + "".join(rng.choice(_COMBINING) for _ in range(rng.randint(1, 3)))
    if kind == 7:
        return rng.choice(_CODE)
    if kind == 8:
        run = rng.choice("a ._-\n0") * rng.randint(2, 40)  # long runs of one character
        return rng.choice([str(rng.randrange(10 ** rng.randint(1, 12))), run])
    return rng.choice(_SPECIAL)


def _random_string(rng: random.Random) -> str:
    if rng.random() < 0.1:  # arbitrary code points (no surrogates): scripts the lists above miss
        return "".join(chr(rng.choice([rng.randrange(0x20, 0xD800), rng.randrange(0xE000, 0x30000)]))
                       for _ in range(rng.randint(1, 12)))
    return "".join(_piece(rng) for _ in range(rng.randint(1, 12)))


def corpus(n: int = 1000, seed: int = 1234) -> list[str]:
    """The hand-picked strings, then random ones up to n strings in all."""
    rng = random.Random(seed)
    out = list(HAND_PICKED)
    while len(out) < n:
        out.append(_random_string(rng))
    return out


class LlamaCppVocab:
    """llama.cpp's tokenizer on a GGUF file (llama-cpp-python, vocabulary only)."""

    def __init__(self, path):
        import llama_cpp

        self.lib = llama_cpp
        self.model = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model.model)
        self.n_tokens = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self.model.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)

    def detokenize(self, ids: list[int], special: bool) -> str:
        """llama_detokenize itself (Llama.detokenize is a Python re-implementation), as text."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = self.lib.llama_detokenize(self.vocab, (self.lib.llama_token * len(ids))(*ids), len(ids),
                                      buf, len(buf), False, special)
        assert n >= 0
        return buf.raw[:n].decode("utf-8", errors="replace")

    def eog_ids(self) -> set[int]:
        return {i for i in range(self.n_tokens) if self.lib.llama_vocab_is_eog(self.vocab, i)}


def gemma3_gguf():
    """Gemma 3 270M's GGUF (scripts/gemma3_path.py), or skip the test."""
    import gemma3_path  # scripts/, on the path via conftest
    import pytest

    path = gemma3_path.locate()
    if path is None:
        pytest.skip("the Gemma 3 chunk packages are not installed")
    return path


def slm_tokenizer(path):
    """slm's tokenizer for a GGUF, from the blob import stores; and the seconds loading took."""
    import time

    from slm.formats.gguf import read_gguf
    from slm.formats.gguf_model import tokenizer_doc_from_gguf
    from slm.model.tokenizer import load_tokenizer

    g = read_gguf(path)
    try:
        doc = tokenizer_doc_from_gguf(g)
    finally:
        g.close()
    start = time.perf_counter()
    tok = load_tokenizer(doc)
    return tok, time.perf_counter() - start
