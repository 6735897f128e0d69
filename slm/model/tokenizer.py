"""Tokenizers built from a base's tokenizer blob with Hugging Face `tokenizers`.

Two sources (see slm.formats): a GGUF's tokenizer.* metadata (GPT-2 style byte-level BPE:
tokens, merges, token types, a named pre-tokenizer), or a Hugging Face tokenizer.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from slm.errors import InvalidInput

# GGUF token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
CONTROL, USER_DEFINED = 3, 4

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
class TextTokenizer:
    tokenizer: Tokenizer
    bos_id: int | None
    eos_ids: frozenset[int]  # generation stops at any of these
    add_bos: bool
    chat_template: str | None
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def load_tokenizer(doc_bytes: bytes) -> TextTokenizer:
    try:
        doc = json.loads(doc_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidInput(f"tokenizer blob is not JSON ({err})") from err
    source = doc.get("source")
    if source == "gguf":
        return _from_gguf(doc["fields"])
    if source == "hf":
        return _from_hf(doc["tokenizer_json"], doc.get("config", {}))
    raise InvalidInput(f"tokenizer blob has unknown source {source!r}")


def _from_gguf(f: dict) -> TextTokenizer:
    tokens: list[str] = f["ggml.tokens"]
    types: list[int] = f.get("ggml.token_type") or [1] * len(tokens)
    pre = f.get("ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise InvalidInput(
            f"GGUF pre-tokenizer {pre!r} is not supported ({', '.join(sorted(PRE_TOKENIZERS))})"
        )
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in f["ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if ty == CONTROL]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    tok.add_special_tokens(specials)
    tok.add_tokens(user)
    bos = f.get("ggml.bos_token_id")
    eos = f.get("ggml.eos_token_id")
    eos_ids = {i for i in (eos, f.get("ggml.eot_token_id"), f.get("ggml.eom_token_id")) if i is not None}
    return TextTokenizer(
        tokenizer=tok,
        bos_id=bos,
        eos_ids=frozenset(eos_ids),
        add_bos=bool(f.get("ggml.add_bos_token", False)),
        chat_template=f.get("chat_template"),
        special_tokens={
            "bos_token": tokens[bos] if bos is not None and bos < len(tokens) else "",
            "eos_token": tokens[eos] if eos is not None and eos < len(tokens) else "",
        },
    )


def _token_text(value) -> str:
    if isinstance(value, dict):  # an AddedToken serialised by transformers
        return value.get("content", "")
    return value or ""


def _from_hf(tokenizer_json: dict, config: dict) -> TextTokenizer:
    try:
        tok = Tokenizer.from_str(json.dumps(tokenizer_json))
    except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
        raise InvalidInput(f"tokenizer.json cannot be loaded: {err}") from err
    bos_text = _token_text(config.get("bos_token"))
    eos_text = _token_text(config.get("eos_token"))
    bos = tok.token_to_id(bos_text) if bos_text else None
    eos = tok.token_to_id(eos_text) if eos_text else None
    return TextTokenizer(
        tokenizer=tok,
        bos_id=bos,
        eos_ids=frozenset({eos} if eos is not None else set()),
        add_bos=bool(config.get("add_bos_token", False)),
        chat_template=config.get("chat_template"),
        special_tokens={"bos_token": bos_text, "eos_token": eos_text},
    )
