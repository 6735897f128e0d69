"""A GGUF file for a base that was not imported from one (Hugging Face weights): the header
llama.cpp's convert_hf_to_gguf.py would write for it, over the base's own tensor bytes.

Only what slm can state exactly is written: the architecture's hyperparameters from the base
manifest, the tokenizer as stored (byte-level BPE: tokens, token types, merges, BOS/EOS, chat
template), and every tensor in its stored type (quantized at import: Q8_0, Q4_0, ... or F32),
the q/k rows of a Llama permuted into GGUF's layout. The pre-tokenizer is llama.cpp's "default"
(slm does not know which of llama.cpp's named pre-tokenizers a checkpoint matches): token ids
fed to llama.cpp run exactly; text it tokenizes itself may split differently.

Llama-family bases with a byte-level BPE tokenizer only; any other is refused (Incompatible)
with the reason.
"""

from __future__ import annotations

import json
import struct

from slm import arch as archs
from slm import quant
from slm.compose.base_manifest import BaseManifest
from slm.errors import Incompatible
from slm.formats.gguf import DEFAULT_ALIGNMENT, MAGIC
from slm.store import StoreDir
from slm.store import digest as dg

_U32, _I32, _F32, _BOOL, _STR, _ARR = 4, 5, 6, 7, 8, 9
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5  # llama.cpp token types
GGML_QUANT_VERSION = 2


def _string(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, vtype: int, value) -> bytes:
    out = _string(key) + struct.pack("<I", vtype)
    if vtype == _STR:
        return out + _string(value)
    if vtype == _ARR:
        item_type, items = value
        out += struct.pack("<IQ", item_type, len(items))
        if item_type == _STR:
            return out + b"".join(_string(s) for s in items)
        return out + struct.pack(f"<{len(items)}{'i' if item_type == _I32 else 'f'}", *items)
    return out + struct.pack({_U32: "<I", _I32: "<i", _F32: "<f", _BOOL: "<?"}[vtype], value)


def _token_id(vocab: dict[str, int], token) -> int | None:
    text = token.get("content") if isinstance(token, dict) else token
    return vocab.get(text) if isinstance(text, str) else None


def _tokenizer_kvs(doc: dict, n_vocab: int, short: str) -> list[bytes]:
    tj = doc.get("tokenizer_json") or {}
    model = tj.get("model") or {}
    if doc.get("source") != "hf" or model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise Incompatible(f"base {short}: only a byte-level BPE tokenizer converts to GGUF "
                           f"(this one is {model.get('type')!r})")
    vocab = dict(model["vocab"])
    special = set()
    for t in tj.get("added_tokens") or ():
        vocab.setdefault(t["content"], t["id"])
        if t.get("special"):
            special.add(t["content"])
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]  # as convert_hf_to_gguf pads a short vocabulary
    types = [_UNUSED] * n_vocab
    for text, idx in vocab.items():
        if 0 <= idx < n_vocab:
            tokens[idx] = text
            types[idx] = _CONTROL if text in special else _NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or ()]
    config = doc.get("config") or {}
    kvs = [_kv("tokenizer.ggml.model", _STR, "gpt2"), _kv("tokenizer.ggml.pre", _STR, "default"),
           _kv("tokenizer.ggml.tokens", _ARR, (_STR, tokens)),
           _kv("tokenizer.ggml.token_type", _ARR, (_I32, types)),
           _kv("tokenizer.ggml.merges", _ARR, (_STR, merges))]
    for key, name in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
        found = _token_id(vocab, config.get(key))
        if found is not None:
            kvs.append(_kv(f"tokenizer.ggml.{name}", _U32, found))
    for key in ("add_bos_token", "add_eos_token"):
        if isinstance(config.get(key), bool):
            kvs.append(_kv(f"tokenizer.ggml.{key}", _BOOL, config[key]))
    if isinstance(config.get("chat_template"), str):
        kvs.append(_kv("tokenizer.chat_template", _STR, config["chat_template"]))
    return kvs


def _arch_kvs(arch: dict, p: str) -> list[bytes]:
    return [
        _kv(p + "block_count", _U32, arch["num_layers"]),
        _kv(p + "context_length", _U32, arch["context_length"]),
        _kv(p + "embedding_length", _U32, arch["hidden_size"]),
        _kv(p + "feed_forward_length", _U32, arch["intermediate_size"]),
        _kv(p + "attention.head_count", _U32, arch["num_heads"]),
        _kv(p + "attention.head_count_kv", _U32, arch["num_kv_heads"]),
        _kv(p + "rope.freq_base", _F32, arch["rope_theta"]),
        _kv(p + "attention.layer_norm_rms_epsilon", _F32, arch["rms_norm_eps"]),
        _kv(p + "attention.key_length", _U32, arch["head_dim"]),
        _kv(p + "attention.value_length", _U32, arch["head_dim"]),
        _kv(p + "vocab_size", _U32, arch["vocab_size"]),
        _kv(p + "rope.dimension_count", _U32, arch["head_dim"]),
    ]


def converted_gguf(store: StoreDir, base_digest: str, manifest: BaseManifest):
    """(header bytes, [(gap, blob digest, nbytes, (heads, rows) of a q/k to permute or None)], tail) of the GGUF
    file for a base imported from Hugging Face weights."""
    short = dg.short(base_digest)
    arch = manifest.architecture
    desc = archs.get(arch["family"])
    if desc.family != "llama":
        raise Incompatible(f"base {short} was imported from Hugging Face weights; converting a "
                           f"{desc.family} base to GGUF is not implemented (llama only)")
    doc = json.loads(store.objects.read_verified(manifest.tokenizer_digest))
    kvs = [_kv("general.architecture", _STR, desc.gguf_arch), _kv("general.type", _STR, "model"),
           _kv("general.name", _STR, f"slm base {short}"), *_arch_kvs(arch, desc.gguf_arch + "."),
           *_tokenizer_kvs(doc, arch["vocab_size"], short),
           _kv("general.quantization_version", _U32, GGML_QUANT_VERSION)]
    table, placed, offset = b"", [], 0
    permute = manifest.qk_row_layout != desc.gguf_qk_row_layout
    for t in manifest.tensors:
        ggml_type = quant.get_codec(t.dtype).ggml_type
        if ggml_type is None:
            raise Incompatible(f"base {short}: tensor {t.name} is {t.dtype}, which GGUF has no type for")
        dims = tuple(reversed(t.shape))
        table += _string(t.name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
        table += struct.pack("<IQ", int(ggml_type), offset)
        heads = None
        if permute and t.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = (arch["num_heads"] if "attn_q" in t.name else arch["num_kv_heads"], t.shape[0])
        placed.append((offset, t.digest, t.nbytes, heads))
        offset += t.nbytes + (-t.nbytes % DEFAULT_ALIGNMENT)
    head = MAGIC + struct.pack("<IQQ", 3, len(manifest.tensors), len(kvs)) + b"".join(kvs) + table
    head += b"\0" * (-len(head) % DEFAULT_ALIGNMENT)
    at, out = 0, []
    for start, digest, nbytes, heads in placed:
        out.append((start - at, digest, nbytes, heads))
        at = start + nbytes
    return head, out, offset - at
