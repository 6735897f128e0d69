"""What scripts/make_tiny_model.py's fixtures share, whatever their family: the tiny shape, the
byte-level BPE tokenizer trained on a fixed corpus, the Hugging Face directory's non-weight
files and the GGUF's tokenizer keys and tensors.

A standalone fixture module like make_tiny_model.py: it must not import `slm`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import TokenType
from gguf.quants import quantize
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# --------------------------------------------------------------------------------------------
# Model shape. head_dim * num_attention_heads == hidden_size; num_key_value_heads < heads so
# grouped-query attention is exercised. Every row length (64, 128) is a multiple of 32, the
# block size of Q4_0/Q4_1/Q5_0/Q8_0, so every matrix can be quantized.
# --------------------------------------------------------------------------------------------
HIDDEN = 64
INTERMEDIATE = 128
N_LAYERS = 2
N_HEADS = 4
N_KV_HEADS = 2
HEAD_DIM = 16
CONTEXT = 256
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
TARGET_VOCAB = 400
# Token order matters: BpeTrainer gives special tokens the first ids, in this order.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_TOKEN = "<|im_start|>"  # as in SmolLM2-Instruct: bos=<|im_start|>, eos=<|im_end|>
EOS_TOKEN = "<|im_end|>"

# ChatML, the template SmolLM2-Instruct uses (minus its default system prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Training text for the tokenizer. Digits, punctuation, newlines, runs of spaces and some
# multi-byte UTF-8 are in here so the merges and the byte-level alphabet get exercised.
CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs into the woods.
A small cat sat on the mat. The cat looked at the bird in the tree, and the bird sang a song for the cat.
Hello world! Hello there, world. The world says hello back to the cat that sat on the mat.

Once upon a time there was a little town by the sea. The people of the town went fishing every morning,
and in the evening they sat together and told stories about the ships that sailed past the harbor.
The children of the town liked the stories about the sea more than anything else in the world.

This is a tiny model made for tests. It has two layers, four heads, and a small vocabulary.
Numbers like 1, 2, 3, 10, 42, 256 and 2024 appear in text too, as do questions: what is the time?
Where is the cat? Why did the dog run? How many ships are in the harbor today? There are 12.

The user asks a question and the assistant answers it. The assistant is helpful, honest and brief.
When the weather is cold, the children wear warm coats; when it is hot, they play in the water.
    Indented lines keep    several spaces, and tabs\tappear\ttoo.
Some words come from other languages: café, naïve, façade, Zürich, smörgåsbord, and the symbol —.
"""


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------
def build_tokenizer() -> Tokenizer:
    """Train a GPT-2 style byte-level BPE on CORPUS.

    ByteLevel(add_prefix_space=False) with its default use_regex=True splits text with the GPT-2
    regex, which is what llama.cpp's pre-tokenizer "gpt-2" implements. BpeTrainer is
    deterministic here: counts do not depend on hashing, ties are broken by pair id and the
    initial alphabet is sorted; the test regenerates to prove it.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.split("\n\n"), trainer=trainer)
    return tok


def tokenizer_tables(tok: Tokenizer) -> tuple[list[str], list[str], list[int]]:
    """(tokens by id, merges as "a b" strings, llama.cpp token types) for the GGUF vocab.

    Read from the serialized tokenizer.json so the GGUF holds exactly what hf/ holds.
    """
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for text, idx in vocab.items():
        tokens[idx] = text
    assert all(t is not None for t in tokens), "vocab ids are not contiguous"
    # tokenizers >= 0.20 serializes merges as [a, b] pairs, older versions as "a b" strings.
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    # Like convert_hf_to_gguf.py's get_vocab_base: special added tokens are CONTROL, rest NORMAL.
    types = [int(TokenType.CONTROL if t in special else TokenType.NORMAL) for t in tokens]
    return tokens, merges, types


def write_json(path: Path, obj) -> None:
    # sort_keys + fixed indent + trailing newline: byte-stable across runs and Python versions.
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def write_hf_common(d: Path, tok: Tokenizer, config: dict) -> None:
    """Everything in an HF dir except the weights."""
    d.mkdir(parents=True, exist_ok=True)
    write_json(d / "config.json", config)
    write_json(
        d / "generation_config.json",
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"], "do_sample": False},
    )
    tok.save(str(d / "tokenizer.json"), pretty=True)
    write_json(
        d / "tokenizer_config.json",
        {
            "tokenizer_class": "GPT2Tokenizer",
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "unk_token": SPECIAL_TOKENS[0],
            # Nothing is added around the text: the chat template writes the markers itself.
            "add_bos_token": False,
            "add_eos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": CONTEXT,
            "chat_template": CHAT_TEMPLATE,
        },
    )


def encode_tensor(arr: np.ndarray, qtype: QT) -> tuple[np.ndarray, QT | None]:
    """(data, raw_dtype) for GGUFWriter.add_tensor.

    F32/F16 are passed as float arrays (the writer infers the type); everything else is the
    uint8 block bytes from gguf.quants with raw_dtype set, from which the writer recovers the
    element shape.
    """
    if qtype == QT.F32:
        return arr.astype(np.float32), None
    if qtype == QT.F16:
        return arr.astype(np.float16), None
    return quantize(arr, qtype), qtype


def write_tokenizer_and_tensors(w, tokens, token_types, merges, tensors, plan) -> dict:
    """The tokenizer keys, the tensors (typed by plan(name, ndim)) and the file itself; returns
    {tensor name: type name}. Shared by every family's fixture writer.

    Tokenizer: model "gpt2" = byte-level BPE. pre "gpt-2" (with the hyphen: the string llama.cpp's
    llama-vocab.cpp matches) selects the plain GPT-2 split regex, the one ByteLevel(use_regex=True)
    applies. "smollm" would additionally split every digit apart, which this tokenizer does not do.
    """
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index(BOS_TOKEN))
    w.add_eos_token_id(tokens.index(EOS_TOKEN))
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    written = {}
    for name, arr in tensors:
        qtype = plan(name, arr.ndim)
        data, raw_dtype = encode_tensor(arr, qtype)
        w.add_tensor(name, data, raw_dtype=raw_dtype)
        written[name] = qtype.name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written
