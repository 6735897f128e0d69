"""The text of a growing list of token ids, kept as decode(ids) gives it, one token at a time.

A streamed answer (`slm run`, `slm serve`) needs the text so far after every token. Decoding the
whole list each time costs time in proportion to its length: quadratic over an answer, and in
the server on the one thread that runs every request's decode step. A token's text depends on
its neighbours only locally (a SentencePiece vocabulary drops the leading space of the first
token; byte tokens make a character only together; a Hugging Face decoder tidies the spaces
around punctuation), so TextStream decodes a window: the last CONTEXT tokens of the part already
settled, then the new ones, and appends what the window gained over its settled head. Whenever
the window's text does not begin with its head's (a character completed across the boundary,
a space the decoder took back), it decodes the whole list instead: the text is then decode(ids)
by definition. tests/real/test_tokenizer.py checks the two agree token by token on both real
tokenizers (random ids, byte tokens, special tokens)."""

from __future__ import annotations

from typing import Callable

CONTEXT = 4  # settled tokens decoded again before the new ones


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self.ids: list[int] = []
        self.text = ""  # decode(self.ids)
        self._settled = 0  # ids[:_settled] decode to _settled_text, which ends in a whole character
        self._settled_text = ""
        self._head: tuple[int, str] = (0, "")  # (window start, decode(ids[start:_settled]))

    def push(self, token: int) -> str:
        """Append a token; returns decode(ids), the text so far (it may end in U+FFFD while a
        character's bytes are incomplete)."""
        self.ids.append(token)
        start = max(0, self._settled - CONTEXT)
        if self._head[0] != start:
            self._head = (start, self._decode(self.ids[start:self._settled]))
        head = self._head[1]
        window = self._decode(self.ids[start:])
        if window.startswith(head):
            self.text = self._settled_text + window[len(head):]
        else:
            self.text = self._decode(self.ids)
        if not self.text.endswith("\ufffd"):
            self._settled, self._settled_text = len(self.ids), self.text
            self._head = (-1, "")  # (the next push decodes the new head)
        return self.text
