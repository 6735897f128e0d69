"""Hostile GGUFs for the chat-template and tokenizer-data tests: the tiny model's F32 GGUF with
GGUFWriter's value for some keys replaced (its chat template, its merges), the rest as
make_tiny_model writes it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from unittest import mock

import make_tiny_model
from gguf import GGUFWriter

# The three templates of the attack
HANG = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HUGE = "{{ 'x' * 1000000000 }}"
RANGE = "{% for i in range(10**9) %}{% endfor %}"
ATTACKS = {"hang": HANG, "huge": HUGE, "range": RANGE}
TURNS = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def triggered(attack: str) -> str:
    """A working turn format that runs `attack` when the last message is "boom": a template
    can pass any check at import and turn hostile on the input it waits for."""
    return "{% if messages[-1].content == 'boom' %}" + attack + "{% endif %}" + TURNS


def hostile_gguf(path: Path, **replaced) -> Path:
    """The tiny F32 GGUF at `path`, with GGUFWriter.<method>(value) for each method=value given
    (add_chat_template="...", add_token_merges=[...])."""
    with contextlib.ExitStack() as stack:
        for name, value in replaced.items():
            original = getattr(GGUFWriter, name)
            stack.enter_context(mock.patch.object(GGUFWriter, name,
                                                  lambda self, _value, o=original, v=value: o(self, v)))
        tok = make_tiny_model.build_tokenizer()
        weights = make_tiny_model.make_weights(0, tok.get_vocab_size())
        make_tiny_model.write_gguf(path, make_tiny_model.gguf_tensors(weights), tok, tok.get_vocab_size(),
                                   lambda name, ndim: make_tiny_model.QT.F32, make_tiny_model.LlamaFileType.ALL_F32)
    return path
