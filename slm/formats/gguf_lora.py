"""GGUF LoRA adapters (llama.cpp's convert_lora_to_gguf.py layout) as AdapterSource.

    metadata  general.architecture = "llama"     (or another slm.arch family; llama.cpp refuses an
                                                   arch other than the model's)
              general.type         = "adapter"
              adapter.type         = "lora"
              adapter.lora.alpha   = f32          (PEFT's lora_alpha; the converter ignores
                                                   rank_pattern, alpha_pattern and use_rslora)
    tensors   <base weight name>.lora_a   GGML ne = [in, r]  -> NumPy (r, in)   = PEFT lora_A
              <base weight name>.lora_b   GGML ne = [r, out] -> NumPy (out, r)  = PEFT lora_B
              F32 by default; F16 / BF16 / Q8_0 with --outtype.

The converter runs lora_B through the same q/k row permutation as the base weights
(LlamaModel.permute on the LoraTorchTensor only reorders B's rows, A is untouched), so the
q/k rows of B are in the layout of the family's GGUF bases: "gguf" for a Llama, "hf" for
Gemma 3 and Qwen (not permuted; slm.arch gguf_qk_row_layout).

Scale (llama.cpp src/llama-adapter.h, llama_adapter_lora_weight::get_scale):
    scale = adapter_scale * alpha / r   if alpha != 0, else adapter_scale
with r = lora_b's ne[0] per tensor and adapter_scale the user's runtime multiplier (1.0 here,
which is what slm records; a missing alpha key reads as 0). Applied as
    y = W x + scale * B (A x)
llama.cpp skips "*_norm.weight" tensors (mergekit extractions) without applying them and
rejects any other suffix; slm refuses both, as it refuses full tensors in PEFT adapters.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from slm import arch as archs
from slm import quant
from slm.arch.roles import linear_role, requires_from_shapes, target_order
from slm.errors import InvalidInput, SlmError
from slm.formats.adapter_source import AdapterSource, AdapterTarget
from slm.formats.gguf import MAGIC, GGUFFile, read_gguf
from slm.formats.untrusted import open_binary
from slm.quant.ggml_types import GGMLType

ADAPTER_TYPE_KEY = "adapter.type"
ALPHA_KEY = "adapter.lora.alpha"
ALORA_KEY = "adapter.alora.invocation_tokens"
# GGML types a LoRA file may use (what convert_lora_to_gguf.py --outtype can write).
SUPPORTED_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0)  # llama.cpp writes these


def is_gguf_lora(path) -> bool:
    """A GGUF file whose general.type is "adapter"."""
    try:
        with open_binary(path) as f:
            if f.read(4) != MAGIC:
                return False
    except OSError:
        return False
    try:
        g = read_gguf(Path(path))
    except SlmError:
        return False
    try:
        return g.metadata.get("general.type") == "adapter"
    finally:
        g.close()


def _nbytes(ggml_type: int, shape: tuple[int, ...]) -> int | None:
    if ggml_type not in SUPPORTED_TYPES:
        return None
    codec = quant.by_ggml_type(ggml_type)
    try:
        return codec.nbytes(shape)
    except quant.QuantError as err:
        raise InvalidInput(f"tensor of shape {shape}: {err}") from err


def read_gguf_lora(path: Path) -> AdapterSource:
    path = Path(path)
    g = read_gguf(path, _nbytes)
    try:
        return _read(g)
    finally:
        g.close()


def _read(g: GGUFFile) -> AdapterSource:
    fname = g.path.name
    meta = g.metadata
    general_type = meta.get("general.type")
    if general_type != "adapter":
        raise InvalidInput(f"{fname}: not a GGUF adapter (general.type={general_type!r})")
    desc = archs.by_gguf_arch(meta.get("general.architecture"), fname)
    adapter_type = meta.get(ADAPTER_TYPE_KEY)
    if adapter_type != "lora":
        raise InvalidInput(f"{fname}: adapter type {adapter_type!r} is not supported (only 'lora')")
    if ALORA_KEY in meta:
        raise InvalidInput(f"{fname}: activated LoRA ({ALORA_KEY}) is not supported")
    alpha = meta.get(ALPHA_KEY, 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise InvalidInput(f"{fname}: {ALPHA_KEY}={alpha!r} is not a finite number")
    alpha = float(alpha)

    pairs: dict[str, dict] = {}
    for info in g.tensors:
        if info.name.endswith((".lora_a", ".lora_b")):
            base, part = info.name[:-7], info.name[-1].upper()
        elif info.name.endswith("_norm.weight"):
            raise InvalidInput(
                f"{fname}: tensor {info.name} is a full norm vector (llama.cpp ignores these, "
                f"slm refuses them)"
            )
        else:
            raise InvalidInput(f"{fname}: tensor {info.name} is neither .lora_a nor .lora_b")
        if info.nbytes is None:
            raise InvalidInput(
                f"{fname}: tensor {info.name} has type {info.type_name}; supported: "
                f"{', '.join(t.name for t in SUPPORTED_TYPES)}"
            )
        pairs.setdefault(base, {})[part] = info

    targets = []
    for base in sorted(pairs, key=target_order):
        parts = pairs[base]
        if set(parts) != {"A", "B"}:
            missing = "lora_b" if "A" in parts else "lora_a"
            raise InvalidInput(f"{fname}: {base} has no {missing} tensor")
        if linear_role(base) is None:
            what = ("the token embedding (not supported)" if base == "token_embd.weight"
                    else "not a Llama linear layer")
            raise InvalidInput(f"{fname}: LoRA tensors for {base}: {what}")
        a_info, b_info = parts["A"], parts["B"]
        if len(a_info.shape) != 2 or len(b_info.shape) != 2:
            raise InvalidInput(
                f"{fname}: {base} lora_a {a_info.shape} / lora_b {b_info.shape} are not matrices")
        if a_info.shape[0] != b_info.shape[1]:
            raise InvalidInput(
                f"{fname}: {base} has mismatched ranks: lora_a {a_info.shape} has r={a_info.shape[0]}, "
                f"lora_b {b_info.shape} has r={b_info.shape[1]}"
            )
        A, B = _decode(g, a_info, fname), _decode(g, b_info, fname)
        r = A.shape[0]
        scale = alpha / r if alpha != 0.0 else 1.0
        targets.append(AdapterTarget(module=base, out_features=B.shape[0], in_features=A.shape[1],
                                     tensors={"A": A, "B": B}, scale=scale))
    if not targets:
        raise InvalidInput(f"{fname}: the adapter is empty (no LoRA tensors)")
    requires = requires_from_shapes(targets, desc.family)
    config = {k: v for k, v in meta.items()
              if k.startswith(("general.", "adapter.")) and isinstance(v, (str, int, float, bool))}
    return AdapterSource(format="gguf-lora", kind="lora", row_layout=desc.gguf_qk_row_layout, targets=targets,
                         requires=requires, config=config)


def _decode(g: GGUFFile, info, fname: str) -> np.ndarray:
    codec = quant.by_ggml_type(info.ggml_type)
    try:
        arr = codec.dequantize(g.tensor_bytes(info), info.shape)
    except quant.QuantError as err:
        raise InvalidInput(f"{fname}: tensor {info.name}: {err}") from err
    if not np.isfinite(arr).all():
        raise InvalidInput(f"{fname}: tensor {info.name} holds non-finite values (NaN or infinity)")
    return arr
