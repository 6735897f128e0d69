"""GGUF vocabularies as llama.cpp reads them (src/llama-vocab.cpp): token types, the
end-of-generation rules, and the SentencePiece tokenizer of `llama` vocabularies. The codec
interface and the byte-level BPE (Hugging Face `tokenizers`) are in slm.model.tokenizer."""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass

import numpy as np

from slm.errors import InvalidInput
from slm.model import token_bytes

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Texts llama.cpp treats as end-of-generation, whatever the file says (llama_vocab::impl::load:
# its EOT, EOM, FIM pad/repo/file-separator and EOG name lists), marking them control tokens too.
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
})
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# GGUF keys (after "tokenizer.") naming end-of-generation tokens
_EOG_KEYS = ("ggml.eos_token_id", "ggml.eot_token_id", "ggml.eom_token_id",
             "ggml.fim_pad_token_id", "ggml.fim_rep_token_id", "ggml.fim_sep_token_id")


@dataclass
class GGUFVocab:
    """A GGUF vocabulary's tokens and what llama.cpp makes of their types (llama_vocab::load)."""

    tokens: list[str]
    index: dict[str, int]  # token text -> id
    types: list[int]
    eog: set[int]  # end-of-generation ids
    control: set[int]  # control or unknown type, or EOG: parsed only on request, dropped in decode
    user_defined: set[int]  # always matched whole in the text, decoded as written

    @classmethod
    def from_fields(cls, f: dict) -> GGUFVocab:
        tokens: list[str] = f["ggml.tokens"]
        n = len(tokens)
        index = dict(zip(tokens, range(n)))
        if "" in index:  # llama.cpp renames an empty token so that no text matches it
            tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
            index = dict(zip(tokens, range(n)))
        if len(index) != n:
            raise InvalidInput("the tokenizer vocabulary has duplicate tokens")
        types = f.get("ggml.token_type") or [NORMAL] * n
        if len(types) < n:
            raise InvalidInput(f"the tokenizer has {n} tokens but {len(types)} token types")
        kinds = np.asarray(types)  # (n,)
        named = (f.get(key) for key in _EOG_KEYS)
        eog = {i for i in named if isinstance(i, int) and 0 <= i < n}
        eog |= {index[t] for t in EOG_TEXTS if t in index}
        control = set(np.flatnonzero((kinds == CONTROL) | (kinds == UNKNOWN)).tolist()) | eog
        user_defined = set(np.flatnonzero(kinds == USER_DEFINED).tolist()) - control
        return cls(tokens, index, types, eog, control, user_defined)

    def token_id(self, f: dict, key: str) -> int | None:
        value = f.get(key)
        return value if isinstance(value, int) and 0 <= value < len(self.tokens) else None


class SentencePieceBPE:
    """llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm), for GGUF `llama` vocabularies.

    encode(text):
      1. cut special tokens out of the text, longest token first (_split_special);
      2. in each remaining fragment, a space prefix if add_space_prefix, spaces -> U+2581;
      3. start from the fragment's characters and merge the adjacent pair whose concatenation is
         the best-scoring piece, until no pair is a piece (ties: leftmost pair first) (_merge);
      4. a symbol that is not a piece (a character outside the vocabulary) becomes the byte
         tokens <0xNN> of its UTF-8 bytes.

    Why not Hugging Face `tokenizers`: it has no "merge any pair that makes a piece" model; a BPE
    model with the merges this implies (513,511 for Gemma 3's 262,144 pieces) gives the same ids
    but takes 1.0-1.6 s to load here (Tokenizer.from_str), this class 0.25 s.
    """

    def __init__(self, vocab: GGUFVocab, scores: list[float], add_space_prefix: bool,
                 unk_id: int | None):
        if len(scores) < len(vocab.tokens):
            raise InvalidInput(f"the tokenizer has {len(vocab.tokens)} tokens but {len(scores)} scores")
        self.vocab = vocab
        self.pieces, self.ids = vocab.tokens, vocab.index
        self.scores = scores
        self.add_space_prefix = add_space_prefix
        self.vocab_size = len(self.pieces)
        # Cut out of the text before the merges, longest first (user-defined ones always).
        self.special = sorted(((self.pieces[i], i) for i in vocab.control | vocab.user_defined),
                              key=lambda p: (-len(p[0]), p[1]))
        self.byte_ids = [self._byte_token(b, unk_id) for b in range(256)]
        self.bound = token_bytes.sentencepiece(self.pieces)
        self._decoded: dict[tuple[int, bool], bytes] = {}

    def _byte_token(self, b: int, unk_id: int | None) -> int | None:
        """<0xNN>, else the byte as a one-character piece (llama.cpp's byte_to_token), else unk."""
        found = self.ids.get(f"<0x{b:02X}>")
        if found is None and b < 0x80:
            found = self.ids.get(chr(b))
        return unk_id if found is None else found

    def encode(self, text: str, parse_special: bool) -> list[int]:
        out: list[int] = []
        for part in self._split_special(text, parse_special):
            if isinstance(part, int):
                out.append(part)
            else:
                # llama.cpp prefixes a fragment at the start or after a special token: since
                # fragments are separated by special tokens, that is every fragment.
                if self.add_space_prefix:
                    part = " " + part
                self._merge(part.replace(" ", "\u2581"), out)
        return out

    def control_texts(self) -> list[str]:
        return [self.pieces[i] for i in sorted(self.vocab.control)]

    def split_special(self, text: str) -> list[str | int]:
        return self._split_special(text, True)

    def _split_special(self, text: str, parse_special: bool) -> list[str | int]:
        """[text fragments and special token ids]: each special token in turn, longest first,
        splits every fragment at its occurrences (llama.cpp's tokenizer_st_partition)."""
        parts: list[str | int] = [text] if text else []
        for piece, token in self.special:
            if (not parse_special and token in self.vocab.control) or piece not in text:
                continue
            split: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or piece not in part:
                    split.append(part)
                    continue
                for k, chunk in enumerate(part.split(piece)):
                    if k:
                        split.append(token)
                    if chunk:
                        split.append(chunk)
            parts = split
        return parts

    def _merge(self, text: str, out: list[int]) -> None:
        sym = list(text)  # symbol texts; "" once merged into the left neighbour
        nxt = list(range(1, len(sym))) + [-1]
        prv = list(range(-1, len(sym) - 1))
        heap: list[tuple[float, int, int, int]] = []  # (-score, left, right, length when pushed)

        def push(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                token = self.ids.get(sym[left] + sym[right])
                if token is not None:
                    heapq.heappush(heap, (-self.scores[token], left, right,
                                          len(sym[left]) + len(sym[right])))

        for i in range(len(sym) - 1):
            push(i, i + 1)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            # Stale: one side was merged away or grew since the pair was pushed.
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != length:
                continue
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[left] >= 0:
                prv[nxt[left]] = left
            push(prv[left], left)
            push(left, nxt[left])
        i = 0 if sym else -1
        while i >= 0:
            token = self.ids.get(sym[i])
            if token is not None:
                out.append(token)
            else:  # one character outside the vocabulary (merged symbols are always pieces)
                for b in sym[i].encode("utf-8"):
                    if self.byte_ids[b] is None:
                        raise InvalidInput(f"the vocabulary cannot encode the byte 0x{b:02X}")
                    out.append(self.byte_ids[b])
            i = nxt[i]

    def decode(self, ids: list[int], special: bool) -> str:
        """llama.cpp's llama_detokenize: pieces joined, U+2581 -> space, <0xNN> -> that byte; the
        first token loses one leading space when the vocabulary adds a space prefix."""
        data = b"".join(self._piece(t, special) for t in ids)
        if self.add_space_prefix and ids and self._piece(ids[0], special).startswith(b" "):
            data = data[1:]
        return data.decode("utf-8", errors="replace")

    def _piece(self, token: int, special: bool) -> bytes:
        key = (token, special)
        if key not in self._decoded:
            text, kind = self.pieces[token], self.vocab.types[token]
            if token in self.vocab.control:
                piece = text.encode() if special else b""
            elif token in self.vocab.user_defined:
                piece = text.encode()
            elif kind == NORMAL:
                piece = text.replace("\u2581", " ").encode()
            elif kind == BYTE and _BYTE_PIECE.fullmatch(text):
                piece = bytes([int(text[3:5], 16)])
            else:  # unused or undefined
                piece = b""
            self._decoded[key] = piece
        return self._decoded[key]
