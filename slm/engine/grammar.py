"""Grammar-constrained decoding with llguidance: a logit processor per constrained row.

A grammar (from a JSON schema, or llguidance's own grammar JSON) is compiled once against the
base's vocabulary (compile_grammar: a grammar the engine refuses is InvalidInput with the
engine's reason); each sequence that must follow it gets its own GrammarMask, a processor of
slm.engine.generation (generated ids, logits row) -> logits row. The mask reads the row's own
matcher only, so constrained and free rows share a batch and no row's mask touches another.

End of generation: the engine lets an end-of-generation token through where the grammar
accepts, and once the grammar can take no more bytes it allows nothing else, so a constrained
answer stops when its grammar is complete. Where the grammar can go no further without being
complete (a schema that derives no finite document, and that escaped the check before
compiling: slm.engine.schema_productive), the engine lets the end through too; the mask's `cut`
then holds, and the answer is reported as cut ("length", slm.engine.stops), never as one that
ended by itself. So is an answer a stop sequence ended where what is left of it is not a
complete document (`accepts`).

Closing within the budget: a mask given the row's max_tokens (`budget`) watches, in the last
CLOSE_WINDOW tokens, how many tokens the answer's shortest closing takes (slm.engine.json_closing:
`"]}` for `{"tags":["a","b`); once that, plus CLOSE_MARGIN, is all the budget left, it forces the
closing, token by token, if the row's own matcher accepts the whole of it. A JSON answer that
would have been cut by max_tokens then still parses; it is reported as cut (`closing` is set:
its finish reason is "length", slm.engine.stops), never as an answer that ended by itself.

llguidance is imported on the first constrained request: `slm run` without --json-schema and
a server that never sees response_format never load it.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING

import numpy as np

from slm.errors import InvalidInput
from slm.engine.json_closing import closing
from slm.engine.schema_productive import accepts_a_document

if TYPE_CHECKING:
    from slm.model.tokenizer import TextTokenizer

# Compact JSON: no whitespace between tokens. With flexible whitespace a weak model can spend
# its whole budget on spaces and never close the object.
JSON_OPTIONS = {"whitespace_flexible": False}

_LOCK = threading.Lock()
# the last tokens of a budget in which a row's closing is measured each step, and the tokens
# kept beyond the closing's own length: one token can lengthen the closing by several (a `"` that
# opens a key commits the answer to `":null}`)
CLOSE_WINDOW = 64
CLOSE_MARGIN = 8


def json_schema_grammar(schema: dict) -> str:
    """The llguidance grammar (its JSON form) of a JSON schema; InvalidInput if it is not one."""
    from llguidance import LLMatcher

    if not isinstance(schema, dict):
        raise InvalidInput("a JSON schema must be a JSON object")
    if not accepts_a_document(schema):
        raise InvalidInput("the JSON schema accepts no finite JSON document "
                           "(a $ref cycle or a required property that contains itself)")
    try:
        return LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)
    except (ValueError, TypeError) as err:
        raise InvalidInput(f"the JSON schema cannot be compiled: {_one_line(err)}") from err


def grammar_tokenizer(tok: TextTokenizer, n_vocab: int):
    """llguidance's view of a base's vocabulary (each token's bytes, the end-of-generation
    ids), built once per tokenizer: it takes a while on a large vocabulary."""
    from llguidance import LLTokenizer, TokenizerWrapper

    codec = tok.codec
    with _LOCK:  # kept on the tokenizer: it lives as long as the base's tokenizer does
        found = tok.__dict__.get("_grammar_tokenizer")
        if found is not None and found[0] == n_vocab:
            return found[1]
        eos = sorted(tok.eos_ids) or ([tok.eos_id] if tok.eos_id is not None else [])
        hf = getattr(codec, "tokenizer", None)
        if hf is not None:  # a Hugging Face tokenizer (GGUF gpt2 or tokenizer.json): its own JSON
            lltok = LLTokenizer(hf.to_str(), n_vocab=n_vocab, eos_token=eos)
        else:
            lltok = LLTokenizer(TokenizerWrapper(_PieceVocabulary(tok, eos)), n_vocab=n_vocab, eos_token=eos)
        tok.__dict__["_grammar_tokenizer"] = (n_vocab, lltok)
        return lltok


class _PieceVocabulary:
    """A SentencePiece vocabulary in the shape llguidance's TokenizerWrapper reads."""

    def __init__(self, tok: TextTokenizer, eos: list[int]):
        codec = tok.codec
        self.eos_token_id = eos[0] if eos else 0
        self.bos_token_id = tok.bos_id
        self.tokens = [codec._piece(i, True) for i in range(codec.vocab_size)]
        self.special_token_ids = sorted(codec.vocab.control)
        self._codec = codec

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._codec.encode(text, False)


def compile_grammar(tok: TextTokenizer, grammar: str, n_vocab: int) -> str:
    """Check a grammar against a base's vocabulary; returns it, or InvalidInput with the
    engine's reason."""
    from llguidance import LLMatcher

    lltok = grammar_tokenizer(tok, n_vocab)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, lltok)
    if is_error:
        raise InvalidInput(f"the grammar cannot be compiled: {_one_line(messages[0] if messages else '')}")
    return grammar


class GrammarMask:
    """One row's grammar state: advanced by each token the row took, masking its logits.

    Nothing is allocated per token: llguidance writes the allowed set as bits into this mask's
    own words, and the masked row is this mask's own buffer (valid until its next call: the
    sampler reads it at once), filled with -inf and then the allowed logits, copied under the
    unpacked bits. A constrained row costs its decode step a few hundredths of a millisecond
    besides the engine's own mask computation (docs/benchmarks.md, "Structured output")."""

    def __init__(self, tok: TextTokenizer, grammar: str, n_vocab: int, budget: int | None = None):
        from llguidance import LLMatcher

        self.lltok = grammar_tokenizer(tok, n_vocab)
        self.grammar = grammar
        self.matcher = LLMatcher(self.lltok, grammar, log_level=0)
        if self.matcher.is_error():
            raise InvalidInput(f"the grammar cannot be compiled: {_one_line(self.matcher.get_error())}")
        self.eos = sorted(tok.eos_ids)
        self.consumed = 0
        self.words = np.zeros((n_vocab + 31) // 32, dtype=np.int32)  # bit i: token i allowed
        self.out: np.ndarray | None = None
        self.budget = budget  # the row's max_tokens (None: never closed early)
        self.closing = False  # the answer is being closed to fit its budget

    def __call__(self, ids: list[int], logits: np.ndarray) -> np.ndarray:
        while self.consumed < len(ids):  # the tokens sampled since the last call
            self.matcher.consume_token(ids[self.consumed])
            self.consumed += 1
        if self.out is None or self.out.shape != logits.shape or self.out.dtype != logits.dtype:
            self.out = np.empty_like(logits)
        out = self.out
        out.fill(-np.inf)
        if self.matcher.is_error():  # (cannot happen while every token came through the mask)
            out[self.eos] = logits[self.eos]
            return out
        forced = self._closing_token(ids)
        if forced is not None:
            self.closing = True
            out[forced] = logits[forced] if np.isfinite(logits[forced]) else 0.0
            return out
        self.matcher.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)
        allowed = np.unpackbits(self.words.view(np.uint8), count=logits.shape[-1], bitorder="little").view(bool)
        np.copyto(out, logits, where=allowed)
        return out

    @property
    def complete(self) -> bool:
        return self.matcher.is_accepting()

    @property
    def cut(self) -> bool:
        """Whether an end of generation taken now leaves an answer its grammar does not accept
        whole: one being closed to fit its budget, or one whose grammar is not complete (where
        it can go no further, llguidance lets only the end through)."""
        return self.closing or not self.matcher.is_accepting()

    def accepts(self, text: str) -> bool:
        """Whether `text` whole is a complete document of this grammar: what a stop sequence
        left of the answer (a matcher of its own: the row's has taken tokens past the cut)."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.lltok, self.grammar, log_level=0)
        return matcher.consume_tokens(self.lltok.tokenize_str(text)) and matcher.is_accepting()

    def _closing_token(self, ids: list[int]) -> int | None:
        """The next token of the answer's closing, if the budget left is no more than the
        closing needs (and the matcher accepts the closing whole, then the end); else None."""
        left = None if self.budget is None else self.budget - len(ids)  # tokens still to sample
        if left is None or left > CLOSE_WINDOW or self.matcher.is_accepting():
            return None
        suffix = closing(self.lltok.decode_bytes(ids).decode("utf-8", "replace"))
        if not suffix:
            return None
        tokens = self.lltok.tokenize_str(suffix)
        if len(tokens) + CLOSE_MARGIN < left:
            return None
        if self.matcher.validate_tokens(tokens + self.eos[:1]) != len(tokens) + 1:
            return None  # the grammar wants more than the structure's closing (a required key, say)
        return tokens[0]


def _one_line(err) -> str:
    return " ".join(str(err).split())
