"""Tokenizers built from a base's tokenizer blob (see slm.formats).

Three kinds of vocabulary, one interface (a codec: encode(text, parse_special) -> ids,
decode(ids, special) -> text):

    blob                                    algorithm                        codec
    GGUF, tokenizer.ggml.model = gpt2       byte-level BPE, merges given     HFCodec (HF tokenizers)
    GGUF, tokenizer.ggml.model = llama      SentencePiece pieces + scores    SentencePieceBPE (below)
    Hugging Face tokenizer.json             what the file says               HFCodec (HF tokenizers)

A GGUF vocabulary gives the same ids as llama.cpp (src/llama-vocab.cpp) on the same file; that is
what tests/test_tokenizer_corpus.py checks. Two llama.cpp rules hold for both GGUF kinds:
  - control, unknown and user-defined tokens are cut out of the text before the merges (control
    and unknown ones only when parsing special tokens); decoding drops control and unknown ones;
  - generation ends at EOS, at the EOT/EOM/FIM ids the file names and at tokens whose text
    llama.cpp knows as end-of-generation (EOG_TEXTS), which it also treats as control tokens.
"""

from __future__ import annotations

import heapq
import json
import re
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from slm.errors import InvalidInput
from slm.model import token_bytes
from slm.model.chat import fallback_template

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

# llama.cpp pre-tokenizer names -> the Hugging Face pre-tokenizer that splits the same way.
_GPT2_SPLIT = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = {
    "gpt-2": lambda: _GPT2_SPLIT,
    "default": lambda: _GPT2_SPLIT,
    # SmolLM2: every digit is its own piece, then the GPT-2 split.
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), _GPT2_SPLIT]
    ),
    "llama-bpe": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]),
}


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


class Codec(Protocol):
    vocab_size: int
    bound: token_bytes.TokenBound | None  # the token count's lower bound from bytes; None: none

    def encode(self, text: str, parse_special: bool) -> list[int]: ...

    def decode(self, ids: list[int], special: bool) -> str: ...


class HFCodec:
    """A Hugging Face `tokenizers` Tokenizer: special added tokens are llama.cpp's control tokens,
    the other added tokens its user-defined ones (always matched whole)."""

    def __init__(self, tokenizer: Tokenizer, bound: token_bytes.TokenBound | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bound = bound

    def encode(self, text: str, parse_special: bool) -> list[int]:
        self.tokenizer.encode_special_tokens = not parse_special
        # encode_batch, not encode: the same ids, but it lets go of the GIL while it works, so
        # a long text does not stall the process's other threads (the server's event loop)
        return self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int], special: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=not special)


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


@dataclass
class TextTokenizer:
    codec: Codec
    bos_id: int | None
    eos_id: int | None
    eos_ids: frozenset[int]  # generation stops at any of these
    add_bos: bool
    add_eos: bool
    chat_template: str | None
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ...

    @property
    def vocab_size(self) -> int:
        return self.codec.vocab_size

    def min_tokens(self, text: str) -> int:
        """At most what encode(text) gives, from the text's bytes alone (slm.model.token_bytes):
        a prompt too long for a context is known without tokenizing it. 0 with no bound."""
        bound = self.codec.bound
        return 0 if bound is None else bound.min_tokens(text)

    @property
    def max_token_bytes(self) -> int | None:
        return None if self.codec.bound is None else self.codec.bound.max_token_bytes

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """llama.cpp's llama_tokenize(text, add_special, parse_special), except that a text that
        already starts with the BOS token gets no second one: a chat template writes BOS itself
        (llama.cpp's chat code strips it from the rendered text for the same reason)."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:  # e.g. undecodable bytes on the command line
            raise InvalidInput(
                f"the text is not valid Unicode (a lone surrogate at {err.start})") from err
        ids = self.codec.encode(text, parse_special)
        if add_special and self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: list[int], *, special: bool = False) -> str:
        return self.codec.decode(ids, special)


def load_tokenizer(doc_bytes: bytes) -> TextTokenizer:
    try:
        doc = json.loads(doc_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidInput(f"tokenizer blob is not JSON ({err})") from err
    source = doc.get("source")
    if source == "gguf":
        return _from_gguf(doc["fields"], doc.get("architecture"))
    if source == "hf":
        return _from_hf(doc["tokenizer_json"], doc.get("config", {}))
    raise InvalidInput(f"tokenizer blob has unknown source {source!r}")


def _from_gguf(f: dict, architecture: str | None) -> TextTokenizer:
    vocab = GGUFVocab.from_fields(f)
    model = f.get("ggml.model")
    if model == "llama":
        codec: Codec = SentencePieceBPE(
            vocab, f.get("ggml.scores") or [0.0] * len(vocab.tokens),
            # llama.cpp's defaults for a SentencePiece vocabulary: space prefix, BOS
            add_space_prefix=bool(f.get("ggml.add_space_prefix", True)),
            unk_id=vocab.token_id(f, "ggml.unknown_token_id"),
        )
        add_bos = bool(f.get("ggml.add_bos_token", True))
    elif model == "gpt2":
        codec = HFCodec(_byte_level_bpe(f, vocab),
                        token_bytes.byte_level(vocab.tokens, vocab.control | vocab.user_defined))
        add_bos = bool(f.get("ggml.add_bos_token", False))
    else:
        raise InvalidInput(f"tokenizer model {model!r} is not supported (gpt2, llama)")
    ids = {name: vocab.token_id(f, f"ggml.{key}_token_id")
           for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))}
    return TextTokenizer(
        codec=codec,
        bos_id=ids["bos"],
        eos_id=ids["eos"],
        eos_ids=frozenset(vocab.eog),
        add_bos=add_bos,
        add_eos=bool(f.get("ggml.add_eos_token", False)),
        chat_template=f.get("chat_template") or fallback_template(architecture),
        special_tokens=_present({f"{name}_token": vocab.tokens[i] if i is not None else ""
                                 for name, i in ids.items()}),
    )


def _byte_level_bpe(f: dict, vocab: GGUFVocab) -> Tokenizer:
    pre = f.get("ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise InvalidInput(
            f"GGUF pre-tokenizer {pre!r} is not supported ({', '.join(sorted(PRE_TOKENIZERS))})"
        )
    merges = [tuple(m.split(" ", 1)) for m in f["ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab.index, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(vocab.tokens[i], special=True, normalized=False)
                            for i in sorted(vocab.control)])
    tok.add_tokens([AddedToken(vocab.tokens[i], special=False, normalized=False)
                    for i in sorted(vocab.user_defined)])
    return tok


def _present(special_tokens: dict[str, str]) -> dict[str, str]:
    """Template variables for the special tokens the vocabulary has (transformers leaves the others
    undefined, which a template can test)."""
    return {k: v for k, v in special_tokens.items() if v}


def _token_text(value) -> str:
    if isinstance(value, dict):  # an AddedToken serialised by transformers
        return value.get("content", "")
    return value or ""


def _from_hf(tokenizer_json: dict, config: dict) -> TextTokenizer:
    try:
        tok = Tokenizer.from_str(json.dumps(tokenizer_json))
    except Exception as err:
        if type(err) is not Exception:  # a bug of ours or of the library, not a bad file
            raise
        # tokenizers (Rust) reports a malformed tokenizer.json as a bare Exception, nothing finer
        raise InvalidInput(f"tokenizer.json cannot be loaded: {err}") from err
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    texts = {k: _token_text(config.get(k)) for k in names}
    bos = tok.token_to_id(texts["bos_token"]) if texts["bos_token"] else None
    eos = tok.token_to_id(texts["eos_token"]) if texts["eos_token"] else None
    # As llama.cpp does for the same model's GGUF: also stop at the added tokens it knows as EOG.
    eog = {i for i, t in tok.get_added_tokens_decoder().items() if t.content in EOG_TEXTS}
    return TextTokenizer(
        codec=HFCodec(tok, token_bytes.tokenizer_json(tokenizer_json)),
        bos_id=bos,
        eos_id=eos,
        eos_ids=frozenset(eog | ({eos} if eos is not None else set())),
        add_bos=bool(config.get("add_bos_token", False)),
        add_eos=bool(config.get("add_eos_token", False)),
        chat_template=config.get("chat_template"),
        special_tokens=_present(texts),
    )
