"""A Hugging Face checkpoint directory (one of the slm.arch families) as a BaseSource, quantized
on import.

    DIR/config.json                       architecture (model_type: llama, gemma3_text, qwen2, qwen3)
    DIR/model.safetensors                 or model.safetensors.index.json + shards
    DIR/tokenizer.json                    HF tokenizers file
    DIR/tokenizer_config.json (optional)  chat template, special tokens
    DIR/chat_template.jinja   (optional)  chat template (newer transformers)

Weights keep the Hugging Face q/k row layout (qk_row_layout = "hf"); the executor applies
RoPE to match. Names are mapped to slm's GGUF-style names; norm weights get the family's
hf_norm_offset added (Gemma: 1), so that slm stores what GGUF stores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from slm import arch as archs
from slm import quant
from slm.errors import InvalidInput, NotFound
from slm.formats import llama
from slm.formats.base_source import BaseSource, SourceTensor, canonical_json, hub_id_of
from slm.formats.gguf_model import TOKENIZER_FORMAT
from slm.formats.jsonfile import read_json_object
from slm.formats.safetensors_io import SafetensorsFile
from slm.formats.untrusted import read_untrusted
from slm.quant import profiles as quant_profiles

QUANT_PROFILES = quant_profiles.PROFILES
MAX_JSON = 64 << 20


def is_hf_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _read_json(path: Path, what: str) -> dict:
    return read_json_object(path, what, MAX_JSON)


def architecture_from_config(cfg: dict, source: str) -> dict:
    """The [architecture] table from config.json: the common fields, then the family's own."""
    desc = archs.by_hf_model_type(cfg.get("model_type"), source)
    try:
        arch = _from_config(cfg, desc)
    except KeyError as err:
        raise InvalidInput(f"{source}: config.json lacks {err.args[0]}") from err
    except (TypeError, ValueError, AttributeError, ArithmeticError) as err:
        raise InvalidInput(f"{source}: config.json has a malformed value ({err})") from err
    except InvalidInput as err:
        raise InvalidInput(f"{source}: {err}") from err
    return archs.check(arch, source)


def _from_config(cfg: dict, desc: archs.Architecture) -> dict:
    if cfg.get("rope_scaling"):
        raise InvalidInput(f"RoPE scaling {cfg['rope_scaling']!r} is not supported")
    rope = cfg.get("rope_parameters") or {}
    # transformers 5 spells it {"rope_type", "rope_theta"}, or one such table per layer type
    per_type = rope if all(isinstance(v, dict) for v in rope.values()) else {"full_attention": rope}
    for params in per_type.values():
        if params.get("rope_type", "default") != "default":
            raise InvalidInput(f"RoPE type {params['rope_type']!r} is not supported")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if archs.HF_ACTIVATIONS.get(act) != desc.activation:
        raise InvalidInput(f"activation {act!r} is not {desc.family}'s ({desc.activation})")
    sliding = cfg.get("use_sliding_window") or "sliding_attention" in (cfg.get("layer_types") or ())
    if sliding and "sliding_window" not in desc.fields:
        raise InvalidInput(f"sliding-window attention is not supported for {desc.family} (llama.cpp ignores it)")
    n_heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    arch = {
        "family": desc.family,
        "vocab_size": int(cfg["vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": int(cfg["intermediate_size"]),
        "num_layers": int(cfg["num_hidden_layers"]),
        "num_heads": n_heads,
        "num_kv_heads": int(cfg.get("num_key_value_heads") or n_heads),
        "head_dim": int(cfg.get("head_dim") or hidden // n_heads),
        "context_length": int(cfg["max_position_embeddings"]),
        "rms_norm_eps": float(cfg["rms_norm_eps"]),
        "rope_theta": float(cfg.get("rope_theta", per_type.get("full_attention", {}).get("rope_theta", 10000.0))),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
    }
    return arch | desc.from_hf(cfg, arch)


def _weight_files(root: Path) -> list[Path]:
    single = root / "model.safetensors"
    index = root / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        weight_map = _read_json(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InvalidInput(f"{index.name}: no weight_map")
        files = sorted(set(weight_map.values()))
        for f in files:
            if not isinstance(f, str) or "/" in f or "\\" in f or f.startswith("."):
                raise InvalidInput(f"{index.name}: invalid shard file name {f!r}")
        return [root / f for f in files]
    if any(root.glob("*.bin")) or any(root.glob("*.pt")):
        raise InvalidInput(
            f"{root.name}: only pickled weights (.bin/.pt) found; slm never unpickles, "
            "convert to safetensors"
        )
    raise InvalidInput(f"{root.name}: no model.safetensors or model.safetensors.index.json")


def tokenizer_doc_from_dir(root: Path) -> bytes:
    tokenizer_json = _read_json(root / "tokenizer.json", "tokenizer")
    config = {}
    if (root / "tokenizer_config.json").is_file():
        config = _read_json(root / "tokenizer_config.json", "tokenizer config")
    kept = {k: config[k] for k in ("chat_template", "bos_token", "eos_token", "add_bos_token",
                                   "add_eos_token") if k in config}
    template_file = root / "chat_template.jinja"
    if template_file.exists() or template_file.is_symlink():  # (a FIFO or a dangling link: refused)
        data = read_untrusted(template_file, MAX_JSON, "chat template")
        try:
            kept["chat_template"] = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InvalidInput(f"{template_file} is not UTF-8 text") from err
    return canonical_json({"format": TOKENIZER_FORMAT, "source": "hf",
                           "tokenizer_json": tokenizer_json, "config": kept})


def open_hf_base(root: Path, profile: str) -> BaseSource:
    if profile not in QUANT_PROFILES:
        raise InvalidInput(f"unknown --quant {profile!r} (choose from {', '.join(QUANT_PROFILES)})")
    if not root.is_dir():
        raise NotFound(f"no such directory: {root}")
    cfg = _read_json(root / "config.json", "model config")
    arch = architecture_from_config(cfg, root.name)
    files = [SafetensorsFile(p) for p in _weight_files(root)]
    try:
        source = _source(root, arch, profile, files)
        source.hub_id = hub_id_of(str(root.resolve())) or hub_id_of(cfg.get("_name_or_path"))
        return source
    except BaseException:
        for f in files:
            f.close()
        raise


def _source(root: Path, arch: dict, profile: str, files: list[SafetensorsFile]) -> BaseSource:
    desc = archs.get(arch["family"])
    where: dict[str, tuple[SafetensorsFile, str]] = {}  # slm name -> (file, HF name)
    for f in files:
        for hf_name, entry in f.tensors.items():
            if hf_name.endswith("rotary_emb.inv_freq"):
                continue  # derived, recomputed by the executor
            name = llama.hf_to_gguf_name(hf_name, desc)
            if name is None:
                raise InvalidInput(f"{root.name}: unexpected tensor {hf_name} for a {desc.family} model")
            if name == "output.weight" and arch["tie_word_embeddings"]:
                continue  # tied: the head is the embedding
            if name in where:
                raise InvalidInput(f"{root.name}: tensor {hf_name} appears in two shards")
            where[name] = (f, hf_name)
    shapes = {n: f.tensors[hf_name].shape for n, (f, hf_name) in where.items()}
    llama.check_tensors(arch, shapes, root.name)
    tensors = []
    for name, (f, hf_name) in where.items():
        shape = shapes[name]
        # f32 norms; the profile's type, or llama.cpp's fallback for rows its block cannot split
        target = quant.get_codec(quant_profiles.tensor_type(
            profile, name, shape, arch["num_layers"], arch["tie_word_embeddings"]))
        # slm stores a norm weight as the factor it multiplies by (slm.arch: hf_norm_offset)
        offset = desc.hf_norm_offset if name.endswith("norm.weight") else 0.0
        tensors.append(SourceTensor(
            name=name, shape=shape, dtype=target.name, nbytes=target.nbytes(shape),
            stored_bytes=(lambda f=f, n=hf_name, c=target, o=offset: _quantize(f, n, c, o)),
        ))
    return BaseSource(
        format="hf", architecture=arch, qk_row_layout="hf", quant_profile=profile,
        tokenizer_doc=(lambda doc=tokenizer_doc_from_dir(root): doc), tensors=tensors,
        closers=[f.close for f in files],
    )


def _quantize(f: SafetensorsFile, hf_name: str, codec, offset: float) -> memoryview:
    values = f.float32(hf_name)
    if offset:
        values = values + np.float32(offset)  # float32, as Gemma3RMSNorm computes 1 + w
    try:
        return memoryview(codec.quantize(values)).cast("B")
    except quant.QuantError as err:
        raise InvalidInput(f"{f.path.name}: tensor {hf_name}: {err}") from err
