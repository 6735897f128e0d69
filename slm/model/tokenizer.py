"""Tokenizers built from a base's tokenizer blob (see slm.formats).

Three kinds of vocabulary, one interface (a codec: encode(text, parse_special) -> ids,
decode(ids, special) -> text):

    blob                                    algorithm                        codec
    GGUF, tokenizer.ggml.model = gpt2       byte-level BPE, merges given     HFCodec (HF tokenizers)
    GGUF, tokenizer.ggml.model = llama      SentencePiece pieces + scores    SentencePieceBPE (gguf_vocab)
    Hugging Face tokenizer.json             what the file says               HFCodec (HF tokenizers)

A GGUF vocabulary gives the same ids as llama.cpp (src/llama-vocab.cpp) on the same file; that is
what tests/real/test_tokenizer_corpus.py checks. Two llama.cpp rules hold for both GGUF kinds:
  - control, unknown and user-defined tokens are cut out of the text before the merges (control
    and unknown ones only when parsing special tokens); decoding drops control and unknown ones;
  - generation ends at EOS, at the EOT/EOM/FIM ids the file names and at tokens whose text
    llama.cpp knows as end-of-generation (EOG_TEXTS), which it also treats as control tokens.
"""

from __future__ import annotations

import contextlib
import functools
import json
from array import array
import re
import threading
from dataclasses import dataclass, field
from typing import Protocol

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from slm.errors import InvalidInput
from slm.model import token_bytes
from slm.model.chat import check_template, fallback_template
from slm.model.gguf_vocab import (  # noqa: F401 (the token types: this module's vocabulary too)
    BYTE, CONTROL, EOG_TEXTS, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, GGUFVocab, SentencePieceBPE,
)

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


class Codec(Protocol):
    vocab_size: int
    bound: token_bytes.TokenBound | None  # the token count's lower bound from bytes; None: none

    def encode(self, text: str, parse_special: bool) -> list[int]: ...

    def decode(self, ids: list[int], special: bool) -> str: ...

    def split_special(self, text: str) -> list[str | int]: ...  # as encode(text, True) cuts it

    def control_texts(self) -> list[str]: ...  # what encode(text, True) alone makes special tokens


class HFCodec:
    """A Hugging Face `tokenizers` Tokenizer: special added tokens are llama.cpp's control tokens,
    the other added tokens its user-defined ones (always matched whole)."""

    def __init__(self, tokenizer: Tokenizer, bound: token_bytes.TokenBound | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bound = bound
        # encode_special_tokens is a setting of the shared Tokenizer: set and used under a lock,
        # or a thread encoding text could see another's parse_special
        self._lock = threading.Lock()

    def encode(self, text: str, parse_special: bool) -> list[int]:
        with self._lock:
            if self.tokenizer is None:
                raise RuntimeError("this tokenizer's encoder was released (a bug: encode after release_encoder)")
            self.tokenizer.encode_special_tokens = not parse_special
            # encode_batch, not encode: the same ids, but it lets go of the GIL while it works,
            # so a long text does not stall the process's other threads (the server's event loop)
            return self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int], special: bool) -> str:
        if self._pieces is not None:
            return self._pieces.decode(ids, special)
        return self.tokenizer.decode(ids, skip_special_tokens=not special)

    _pieces: "ByteLevelPieces | None" = None  # set by release_encoder

    def release_encoder(self) -> bool:
        """Keep only what decoding needs: each token's bytes (ByteLevelPieces), not the Rust
        tokenizer (its vocabulary, merges and special-token tables: 57 MiB for a 128k-token GGUF
        vocabulary, beside weights of 0.7 GB at 1B). For a caller that encodes once and then only
        decodes (`slm run`). Only a byte-level vocabulary whose added tokens are all special is
        decoded this way (ByteLevelPieces says why); False, and nothing released, otherwise."""
        with self._lock:
            if self.tokenizer is None:
                return True
            pieces = ByteLevelPieces.of(self.tokenizer)
            if pieces is None:
                return False
            self._pieces, self.tokenizer = pieces, None
            self.__dict__.pop("_special_pattern", None)
        return True

    def control_texts(self) -> list[str]:
        return [t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special and t.content]

    def split_special(self, text: str) -> list[str | int]:
        """[text fragments and special token ids], cut where encode(text, True) cuts: at the
        special added tokens, leftmost and longest first, each taking the whitespace beside it
        that its lstrip / rstrip says it takes."""
        pattern, ids = self._special_pattern
        if pattern is None:
            return [text] if text else []
        parts: list[str | int] = []
        at = 0
        for match in pattern.finditer(text):
            if match.start() > at:
                parts.append(text[at:match.start()])
            parts.append(ids[match.lastgroup])
            at = match.end()
        if at < len(text):
            parts.append(text[at:])
        return parts

    @functools.cached_property
    def _special_pattern(self) -> tuple[re.Pattern | None, dict[str, int]]:
        """(one pattern matching any special added token, its group names -> token ids)."""
        specials = [(i, t) for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special and t.content]
        if not specials:
            return None, {}
        specials.sort(key=lambda it: (-len(it[1].content), it[0]))  # longest first: leftmost-longest
        alternatives, ids = [], {}
        for k, (i, t) in enumerate(specials):
            ids[f"t{k}"] = i
            alternatives.append((r"\s*" if t.lstrip else "") + f"(?P<t{k}>{re.escape(t.content)})"
                                + (r"\s*" if t.rstrip else ""))
        return re.compile("|".join(alternatives)), ids


class ByteLevelPieces:
    """Hugging Face's decode of a byte-level BPE tokenizer (GGUF `gpt2`) without the tokenizer:
    each token's text mapped back to bytes by GPT-2's byte alphabet (a text with a character
    outside it, such as an added token's, stands for its own UTF-8 bytes, as the ByteLevel
    decoder does), special added tokens dropped unless asked for, the bytes decoded as UTF-8
    with U+FFFD for what is not (Rust's from_utf8_lossy). Only for vocabularies whose added
    tokens are all special: tests/cli/test_scale.py checks it against the tokenizer's own decode.
    Kept compact (one bytes object, an offset and a flag per token: ~2 MB at 128k tokens), not
    as an object per token, whose 128k small allocations would pin the freed heap around them."""

    def __init__(self, blob: bytes, offsets: array, special: bytearray):
        self.blob, self.offsets, self.special = memoryview(blob), offsets, special

    @classmethod
    def of(cls, tok: Tokenizer) -> "ByteLevelPieces | None":
        if type(tok.decoder) is not decoders.ByteLevel or tok.normalizer is not None:
            return None
        added = tok.get_added_tokens_decoder()
        if not all(t.special for t in added.values()):
            return None
        char_byte = {token_bytes._byte_level_char(b): b for b in range(256)}

        def piece(text: str) -> bytes:
            try:
                return bytes([char_byte[c] for c in text])
            except KeyError:
                return text.encode("utf-8", "surrogatepass")

        by_id = tok.get_vocab(with_added_tokens=True)
        n = max(by_id.values(), default=-1) + 1
        pieces = [b""] * n
        for text, token in by_id.items():
            pieces[token] = piece(text)
        offsets = array("Q", [0])
        for p in pieces:
            offsets.append(offsets[-1] + len(p))
        special = bytearray(n)
        for token in added:
            if 0 <= token < n:
                special[token] = 1
        return cls(b"".join(pieces), offsets, special)

    def decode(self, ids: list[int], special: bool) -> str:
        blob, offsets, skip = self.blob, self.offsets, self.special
        n = len(skip)  # (an id past the vocabulary, which a padded output row may give, is
        # skipped, as the tokenizer skips an id it has no token for)
        out = bytearray()
        for i in ids:
            if 0 <= i < n and (special or not skip[i]):
                out += blob[offsets[i]:offsets[i + 1]]
        return out.decode("utf-8", "replace")


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
        _check_text(text)
        ids = self.codec.encode(text, parse_special)
        return self._add_special(ids) if add_special else ids

    def _add_special(self, ids: list[int]) -> list[int]:
        if self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        if self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def encode_with_literals(self, text: str, literals: dict[str, str]) -> list[int]:
        """encode(text), except that each character of `literals` in it is encoded as the text
        it stands for, as ordinary text, never as a special token: a chat template's rendering,
        in which the messages' own special-token texts stand as such characters
        (slm.model.chat.chat_prompt_ids). The special tokens left in `text` (the template's)
        are parsed; the text between them is encoded as encode does it, literals restored."""
        _check_text(text)
        table = str.maketrans(literals)
        ids: list[int] = []
        for part in self.codec.split_special(text):
            ids.extend([part] if isinstance(part, int) else self.codec.encode(part.translate(table), False))
        return self._add_special(ids)

    def control_texts(self) -> list[str]:
        """The texts that encode(text) turns into special (control) tokens."""
        return self.codec.control_texts()

    def decode(self, ids: list[int], *, special: bool = False) -> str:
        return self.codec.decode(ids, special)

    def piece_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (a special token's text included): a piece of a
        multi-byte character is not text on its own (llama-server's /tokenize with_pieces)."""
        piece = getattr(self.codec, "_piece", None)
        if piece is not None:  # SentencePieceBPE
            return piece(token, True)
        tok = self.codec.tokenizer
        text = tok.id_to_token(token) if tok is not None else None
        if text is None:
            return self.codec.decode([token], True).encode()
        if type(tok.decoder) is decoders.ByteLevel and token not in tok.get_added_tokens_decoder():
            table = _byte_level_table()
            return bytes(table[c] for c in text) if all(c in table for c in text) else text.encode()
        return tok.decode([token], skip_special_tokens=False).encode()

    def token_text(self, token: int) -> str:
        """A token as the vocabulary spells it (byte-level BPE's `Ġ` for a space, SentencePiece's
        `▁`): transformers' convert_ids_to_tokens, what vLLM's /tokenize gives as token_strs."""
        pieces = getattr(self.codec, "pieces", None)
        if pieces is not None:  # SentencePieceBPE
            return pieces[token]
        tok = self.codec.tokenizer
        text = tok.id_to_token(token) if tok is not None else None
        return text if text is not None else self.codec.decode([token], True)

    def release_encoder(self) -> bool:
        """Free what only encoding needs, for a caller done encoding (HFCodec.release_encoder),
        and give the memory back to the kernel; False if this vocabulary keeps it (decode stays
        the same either way). encode after a release that returned True is a bug."""
        release = getattr(self.codec, "release_encoder", None)
        if release is None or not release():
            return False
        from slm.model.allocator import release_freed_memory

        release_freed_memory()
        return True


@functools.lru_cache(maxsize=1)
def _byte_level_table() -> dict[str, int]:
    return {token_bytes._byte_level_char(b): b for b in range(256)}


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # e.g. undecodable bytes on the command line
        raise InvalidInput(f"the text is not valid Unicode (a lone surrogate at {err.start})") from err


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


def check_tokenizer(doc_bytes: bytes) -> None:
    """What a run would find wrong with a tokenizer blob, found when its base is imported or
    pulled (InvalidInput): data that builds no tokenizer, or one without a token, or a chat
    template that fails or exceeds a bound on a plain conversation (slm.model.chat.check_template)."""
    tok = load_tokenizer(doc_bytes)
    if tok.vocab_size == 0:
        raise InvalidInput("the tokenizer has no tokens")
    check_template(tok.chat_template, tok.special_tokens)


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
    with _library_refusal("the GGUF tokenizer cannot be built"):
        tok = Tokenizer(models.BPE(vocab=vocab.index, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(vocab.tokens[i], special=True, normalized=False)
                            for i in sorted(vocab.control)])
    tok.add_tokens([AddedToken(vocab.tokens[i], special=False, normalized=False)
                    for i in sorted(vocab.user_defined)])
    return tok


@contextlib.contextmanager
def _library_refusal(what: str):
    """tokenizers (Rust) reports data it cannot build from (a merge naming a token outside the
    vocabulary, a malformed tokenizer.json) as a bare Exception, nothing finer: InvalidInput."""
    try:
        yield
    except Exception as err:
        if type(err) is not Exception:  # a bug of ours or of the library, not bad data
            raise
        raise InvalidInput(f"{what}: {err}") from err


def _present(special_tokens: dict[str, str]) -> dict[str, str]:
    """Template variables for the special tokens the vocabulary has (transformers leaves the others
    undefined, which a template can test)."""
    return {k: v for k, v in special_tokens.items() if v}


def _token_text(value) -> str:
    if isinstance(value, dict):  # an AddedToken serialised by transformers
        return value.get("content", "")
    return value or ""


def _from_hf(tokenizer_json: dict, config: dict) -> TextTokenizer:
    with _library_refusal("tokenizer.json cannot be loaded"):
        tok = Tokenizer.from_str(json.dumps(tokenizer_json))
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
