"""A lower bound on a text's token count from its bytes alone, per kind of vocabulary.

A prompt of B bytes, each inside some token of at most max_token_bytes bytes, needs at least
ceil(B / max_token_bytes) tokens, so a server can refuse a prompt that cannot fit its context
from its length alone, before tokenizing it (tokenizing a megabyte takes seconds and the
allocator's memory, docs/serve.md). The bound holds only when the tokenizer shrinks nothing
but what it drops byte by byte (a byte-level vocabulary without a byte's token drops that
byte: such bytes are not counted): no normalizer, no pre-tokenizer that removes text, no added
token that swallows the whitespace around it. Where that cannot be shown, None: no bound.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenBound:
    max_token_bytes: int  # the most text bytes one token stands for
    dropped: bytes = b""  # byte values the tokenizer drops (no token covers them): not counted

    def min_tokens(self, text: str) -> int:
        data = text.encode("utf-8", "surrogatepass")
        if self.dropped:
            data = data.translate(None, self.dropped)
        return -(-len(data) // self.max_token_bytes)

# pre-tokenizers that keep every byte of their input (Split only with a behaviour that keeps)
_KEEPING = {"ByteLevel", "Digits", "Split"}


def _byte_level_char(b: int) -> str:
    """GPT-2's bytes_to_unicode: the character a byte-level vocabulary writes byte b as."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if b in printable:
        return chr(b)
    return chr(256 + sorted(set(range(256)) - set(printable)).index(b))


def byte_level(tokens: list[str], added: set[int]) -> TokenBound | None:
    """A byte-level BPE vocabulary (GGUF `gpt2`, tokenizer.json ByteLevel): a normal token's
    characters are one text byte each; an added token is matched as its UTF-8 text; a byte
    whose character is not a token is dropped (Hugging Face BPE without an unknown token)."""
    index = set(tokens)
    dropped = bytes(b for b in range(256) if _byte_level_char(b) not in index)
    lengths = (len(t.encode()) if i in added else len(t) for i, t in enumerate(tokens))
    longest = max(lengths, default=0)
    return TokenBound(longest, dropped) if longest else None


def sentencepiece(pieces: list[str]) -> TokenBound:
    """SentencePiece pieces (slm.model.tokenizer.SentencePieceBPE): a piece covers at most its
    UTF-8 length of text (U+2581 stands for one space but counts 3, <0xNN> for one byte but
    counts 6: over, never under); a character outside the vocabulary becomes one token per
    byte."""
    return TokenBound(max(1, max((len(p.encode()) for p in pieces), default=1)))


def tokenizer_json(doc: dict) -> TokenBound | None:
    """A Hugging Face tokenizer.json: a bound only for the byte-level BPE shape shown to keep
    every byte (see the module doc); None for anything else."""
    if doc.get("normalizer") is not None:
        return None
    pre = doc.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") or [] if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if "ByteLevel" not in kinds or not set(kinds) <= _KEEPING:
        return None
    if any(s.get("type") == "Split" and s.get("behavior") == "Removed" for s in steps):
        return None
    model = doc.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or model.get("unk_token") is not None:
        return None  # (an unknown token may stand for any run of text: fuse_unk)
    added = doc.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") for t in added):
        return None
    base = byte_level(list(vocab), set())
    if base is None:
        return None
    longest = max([base.max_token_bytes, *(len(str(t.get("content", "")).encode()) for t in added)])
    return TokenBound(longest, base.dropped)
