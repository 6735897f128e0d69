"""A GGUF model file (one of the slm.arch families) as a BaseSource: tensors kept byte for byte
as stored."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np

from slm import arch as archs
from slm import quant
from slm.errors import InvalidInput
from slm.formats import llama
from slm.formats.base_source import BaseSource, SourceTensor, canonical_json, hub_id_of
from slm.formats.gguf import GGUFFile, read_gguf
from slm.formats.gguf_frame import frame_of

TOKENIZER_FORMAT = "slm-tokenizer/1"
# where a GGUF writer (llama.cpp's convert_hf_to_gguf) records the Hub repository it converted
HUB_ID_KEYS = ("general.source.huggingface.repository", "general.source.url", "general.base_model.0.repo_url")


def supported_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int | None:
    codec = quant.by_ggml_type(ggml_type)
    if codec is None:
        return None
    try:
        return codec.nbytes(shape)
    except quant.QuantError as err:
        raise InvalidInput(f"tensor of shape {shape}: {err}") from err


def open_gguf_base(path: Path) -> BaseSource:
    g = read_gguf(path, supported_nbytes)
    try:
        return _source(g)
    except BaseException:
        g.close()
        raise


def _source(g: GGUFFile) -> BaseSource:
    name = g.path.name
    unsupported = sorted({t.type_name for t in g.tensors if t.nbytes is None})
    if unsupported:
        supported = ", ".join(sorted(n.upper() for n in _supported_ggml_names()))
        raise InvalidInput(
            f"{name}: unsupported tensor type {', '.join(unsupported)} "
            f"(supported: {supported})"
        )
    arch = architecture_from_gguf(g)
    shapes = {t.name: t.shape for t in g.tensors}
    llama.check_tensors(arch, shapes, name)
    tensors = [
        SourceTensor(
            name=t.name,
            shape=t.shape,
            dtype=quant.by_ggml_type(t.ggml_type).name,
            nbytes=t.nbytes,
            stored_bytes=(lambda t=t: g.tensor_bytes(t)),
            pieces=(lambda size, t=t: g.tensor_pieces(t, size)),
            file_range=(lambda t=t: (g.fd, t.offset)),
        )
        for t in g.tensors
    ]
    return BaseSource(
        format="gguf",
        architecture=arch,
        qk_row_layout=archs.get(arch["family"]).gguf_qk_row_layout,
        quant_profile=_dominant_type(tensors),
        tokenizer_doc=tokenizer_builder(g),
        tensors=tensors,
        closers=[g.close],
        unchanged=g.unchanged_since_opened,
        gguf_frame=lambda: frame_of(g),
        hub_id=next(filter(None, (hub_id_of(_meta(g, k)) for k in HUB_ID_KEYS)), None),
    )


def _supported_ggml_names() -> list[str]:
    return [c.name for c in (quant.by_ggml_type(i) for i in range(64)) if c is not None]


def _dominant_type(tensors: list[SourceTensor]) -> str:
    """The quantization profile: the type holding most 2-D weights (by element count)."""
    counts: Counter[str] = Counter()
    for t in tensors:
        if len(t.shape) == 2:
            counts[t.dtype] += int(np.prod(t.shape))
    return counts.most_common(1)[0][0] if counts else "f32"


def _meta(g: GGUFFile, key: str, default=None, *, required: bool = False):
    if key in g.metadata:
        return g.metadata[key]
    if required:
        raise InvalidInput(f"{g.path.name}: missing GGUF metadata {key}")
    return default


def architecture_from_gguf(g: GGUFFile) -> dict:
    """The [architecture] table of a GGUF model: the common fields read the way llama.cpp reads
    them (keys under "<general.architecture>."), then the family's own (slm.arch)."""
    desc = archs.by_gguf_arch(_meta(g, "general.architecture", required=True), g.path.name)
    p = desc.gguf_arch + "."

    def meta(key: str, default=archs.REQUIRED):
        return _meta(g, p + key, None if default is archs.REQUIRED else default,
                     required=default is archs.REQUIRED)

    try:
        arch = _from_metadata(g, desc, meta)
    except (TypeError, ValueError, ArithmeticError) as err:
        raise InvalidInput(f"{g.path.name}: malformed {desc.gguf_arch} metadata ({err})") from err
    return archs.check(arch, g.path.name)


def _from_metadata(g: GGUFFile, desc: archs.Architecture, meta) -> dict:
    scaling = meta("rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise InvalidInput(f"{g.path.name}: RoPE scaling {scaling!r} is not supported")
    hidden = int(meta("embedding_length"))
    n_heads = int(meta("attention.head_count"))
    n_kv = int(meta("attention.head_count_kv", n_heads))
    head_dim = int(meta("attention.key_length", hidden // max(n_heads, 1)))
    if int(meta("attention.value_length", head_dim)) != head_dim:
        raise InvalidInput(f"{g.path.name}: value heads of another size than key heads are not supported")
    if int(meta("rope.dimension_count", head_dim)) != head_dim:
        raise InvalidInput(f"{g.path.name}: partial rotary embeddings are not supported")
    tokens = _meta(g, "tokenizer.ggml.tokens", required=True)
    arch = {
        "family": desc.family,
        "vocab_size": int(meta("vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_layers": int(meta("block_count")),
        "num_heads": n_heads,
        "num_kv_heads": n_kv,
        "head_dim": head_dim,
        "context_length": int(meta("context_length")),
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in g.tensors),
    }
    return arch | desc.from_gguf(meta, arch)


def _plain(value):
    """GGUF metadata values as JSON-able Python (NumPy arrays -> lists)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        if all(type(v) is str for v in value):  # a vocabulary: 50,000 calls saved
            return value
        return [_plain(v) for v in value]
    return value


# tokenizer.ggml.model -> the tokenizer.* arrays slm needs to rebuild it (slm.model.tokenizer)
TOKENIZER_MODELS = {
    "gpt2": ("ggml.tokens", "ggml.merges"),  # byte-level BPE with its merges (GPT-2, SmolLM2)
    "llama": ("ggml.tokens",),  # SentencePiece pieces with scores and types (Llama 2, Gemma)
}


def tokenizer_doc_from_gguf(g: GGUFFile) -> bytes:
    """The tokenizer as stored: every tokenizer.* key of the GGUF, as canonical JSON, and for a
    file without a chat template general.architecture (it picks the fallback template). A file
    with a template stores exactly what slm 0.1 stored: its bases keep their digests."""
    return tokenizer_builder(g)()


def tokenizer_builder(g: GGUFFile) -> Callable[[], bytes]:
    """`tokenizer_doc_from_gguf` in two steps: the checks now, the serialising (the JSON of a
    49,000-token vocabulary and its merges) when the returned function is called."""
    model = _meta(g, "tokenizer.ggml.model", required=True)
    if model not in TOKENIZER_MODELS:
        raise InvalidInput(
            f"{g.path.name}: tokenizer model {model!r} is not supported "
            f"(slm runs {', '.join(sorted(TOKENIZER_MODELS))})"
        )
    raw = {k[len("tokenizer."):]: v for k, v in g.metadata.items() if k.startswith("tokenizer.")}
    for required in TOKENIZER_MODELS[model]:
        if required not in raw:
            raise InvalidInput(f"{g.path.name}: missing GGUF metadata tokenizer.{required}")
    architecture = _meta(g, "general.architecture")

    def build() -> bytes:
        doc = {"format": TOKENIZER_FORMAT, "source": "gguf", "fields": {k: _plain(v) for k, v in raw.items()}}
        if "chat_template" not in raw:
            doc["architecture"] = architecture
        try:
            return canonical_json(doc)
        except (TypeError, ValueError) as err:
            raise InvalidInput(f"{g.path.name}: tokenizer metadata cannot be stored: {err}") from err

    return build
