"""Why a generation stops, and the text it streams until then: the one module that decides both.

`slm run`, the Python API and `slm serve` all end their generations here (slm.engine.generation
drives a StopRules per sequence). After each sampled token the checks run in this order:

1. the caller's reason (`slm run`: "switched" when refs/active changed);
2. "eos": an end-of-generation token (its text is not part of the answer); "length" instead if
   it leaves a grammar's answer cut (`cut`, slm.engine.grammar): closed to fit max_tokens, or
   ended where the grammar is not complete. A constrained answer that ends by itself is one its
   grammar accepts whole. With ignore_eos an end-of-generation token is an answer token like
   any other;
3. "stop": one of the request's stop token ids was generated (its text is not part of the
   answer), or one of its stop sequences appeared in the text (the text ends before it);
   "length" instead if the answer follows a grammar (`accepts`) and what is left of it is not a
   complete document of that grammar: the stop cut it;
4. "length": max_tokens tokens generated;
5. "context": the sequence's KV cache is full.

vLLM's options, with vLLM's meaning: with include_stop, the text that stopped it stays in the
answer (a stop sequence, or a stop token's or end-of-generation token's text: nothing for a
special token the decode skips); until more than min_tokens tokens are generated no stop
applies (the stop and end-of-generation tokens are banned meanwhile,
slm.engine.processors.MinTokens; a stop sequence counts if it ends in a later token's text).

The text streams as soon as it decodes to whole characters (TextStream), except a tail that
could still become a stop sequence: it is held back until the next token settles it, so no
client ever receives a part of a stop sequence (with include_stop nothing is held back: the
stop sequence is part of the answer). When generation ends the rest is flushed (all of it, or
up to the stop).
"""

from __future__ import annotations

from typing import Callable, Iterable

from slm.engine.detokenize import TextStream

EOS, STOP, LENGTH, CONTEXT = "eos", "stop", "length", "context"
SWITCHED = "switched"  # `slm run`'s caller reason: refs/active changed mid-generation (--on-switch stop)
CANCELLED = "cancelled"  # the server's: the client went away or the server stops

INCOMPLETE = "\ufffd"  # what decode gives for a character whose bytes are not all there yet


class StopRules:
    """One sequence's stop state: the generated ids, the text so far, what was sent of it, and
    once generation is over the reason (None while it goes on)."""

    def __init__(self, eos_ids: Iterable[int], max_tokens: int,
                 decode: Callable[[list[int]], str] | None = None, stop_sequences: Iterable[str] = (),
                 on_text: Callable[[str], None] | None = None,
                 caller: Callable[[int], str | None] | None = None, *, stop_ids: Iterable[int] = (),
                 min_tokens: int = 0, include_stop: bool = False):
        """decode: the tokenizer's, to follow the text (None: ids only, no text, no stop
        sequences). on_text(piece): each new piece of text as it settles. caller(token): a
        reason of the caller's to stop after this token, or None. eos_ids: the tokens that end
        generation as "eos" (none with ignore_eos); stop_ids: those that end it as "stop"."""
        self.eos_ids, self.max_tokens = frozenset(eos_ids), max_tokens
        self.stop_ids = frozenset(stop_ids) - self.eos_ids
        self.min_tokens, self.include_stop = min_tokens, include_stop
        self.stop_sequences = tuple(s for s in stop_sequences if s)
        if self.stop_sequences and decode is None:
            raise ValueError("stop sequences need the tokenizer's decode")
        self.stream = TextStream(decode) if decode is not None else None
        self.on_text, self.caller = on_text, caller
        self.ids: list[int] = []  # every generated token, an end-of-generation one included
        self.sent = 0  # characters of text already given to on_text
        self.cut: int | None = None  # where a stop sequence cut the text
        self.checked = 0  # characters of text searched for stop sequences
        self.reason: str | None = None

    def hidden(self, token: int) -> bool:
        """Whether a token ends generation with no text or logprob of its own in the answer (an
        end-of-generation or stop token, unless include_stop)."""
        return not self.include_stop and (token in self.eos_ids or token in self.stop_ids)

    @property
    def stops_apply(self) -> bool:
        """Whether stops end generation yet: once more than min_tokens tokens are generated,
        the one just taken included (vLLM's count)."""
        return len(self.ids) > self.min_tokens

    @property
    def text(self) -> str:
        """The answer's text so far: the generated tokens but hidden ones (an end-of-generation
        or stop token), up to a stop sequence that ended it."""
        full = self.stream.text if self.stream is not None else ""
        return full if self.cut is None else full[:self.cut]

    def take(self, token: int, cache_full: bool, cut: bool = False,
             accepts: Callable[[str], bool] | None = None) -> str | None:
        """Record a sampled token (cache_full: its sequence has no position left for the next;
        cut: an end of generation here leaves a grammar's answer incomplete; accepts(text): for
        an answer that follows a grammar, whether text is a complete document of it); returns
        the stop reason when generation ends with it, else None."""
        self.ids.append(token)
        eos = token in self.eos_ids and self.stops_apply
        stop_token = token in self.stop_ids and self.stops_apply
        if self.stream is not None and not self.hidden(token):
            self.stream.push(token)
        reason = self.caller(token) if self.caller else None
        if reason:
            return self.finish(reason)
        if eos:
            return self.finish(LENGTH if cut else EOS)
        if stop_token or self._stop_sequence_seen():
            return self.finish(STOP if accepts is None or accepts(self.text) else LENGTH)
        if len(self.ids) >= self.max_tokens:
            return self.finish(LENGTH)
        if cache_full:
            return self.finish(CONTEXT)
        self._send(self._settled_text())
        return None

    def finish(self, reason: str) -> str:
        """End generation for `reason`, sending the rest of the text (up to a stop sequence)."""
        if self.reason is None:
            self.reason = reason
            self._send(self.text)
        return self.reason

    def _stop_sequence_seen(self) -> bool:
        """Whether a stop sequence ends in the text added since the last search (vLLM's rule:
        one that ended within the first min_tokens tokens never counts)."""
        if not self.stop_sequences or self.stream is None:
            return False
        text = self.stream.text
        if text.endswith(INCOMPLETE):
            return False  # an incomplete character cannot complete a stop sequence yet
        checked, self.checked = self.checked, len(text)
        if not self.stops_apply:
            return False
        found = [(p, p + len(s)) for s in self.stop_sequences
                 if (p := text.find(s, max(0, checked - len(s) + 1))) >= 0]
        if found:
            start, end = min(found)
            self.cut = end if self.include_stop else start
        return bool(found)

    def _settled_text(self) -> str:
        """The text that may go out now: whole characters, and no tail that could still grow
        into a stop sequence."""
        text = self.stream.text if self.stream is not None else ""
        if text.endswith(INCOMPLETE):
            return text[:self.sent]  # wait for the character's next bytes
        hold = 0 if self.include_stop else \
            max((k for s in self.stop_sequences for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return text[:len(text) - hold]

    def _send(self, text: str) -> None:
        if len(text) > self.sent:
            if self.on_text is not None:
                self.on_text(text[self.sent:])
            self.sent = len(text)
