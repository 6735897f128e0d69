"""Exporters: a stored LoRA adapter as a llama.cpp GGUF LoRA or a PEFT adapter directory.

The inverses of slm.formats.gguf_lora and slm.formats.peft, for LoRA only (IA3 and sparse
deltas have no GGUF LoRA form; refused in one line):

  gguf-lora  <module>.lora_a (NumPy (r, in)), <module>.lora_b ((out, r)), F32;
             general.architecture = the family's GGUF name, general.type = "adapter",
             adapter.type = "lora", adapter.lora.alpha. llama.cpp applies alpha / r per tensor:
             when every target has the same alpha (scale x rank) it is written as is; otherwise
             each B is pre-multiplied by its scale and alpha is 0 (llama.cpp then scales by 1).
             q/k rows of B in the layout of the family's GGUF bases (permuted for a Llama).
  peft       adapter_config.json (peft_type LORA, r / lora_alpha, rank_pattern / alpha_pattern
             per module where they differ, target_modules = the exact module paths) and
             adapter_model.safetensors keyed base_model.model.<module>.lora_{A,B}.weight; q/k
             rows in Hugging Face order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from slm import arch as archs
from slm.arch.roles import qk_heads
from slm.compose.adapter_manifest import AdapterManifest, tensor_from_bytes
from slm.compose.base_manifest import BaseManifest
from slm.distribution.gguf_writer import write_gguf
from slm.errors import Incompatible
from slm.formats.llama import gguf_to_hf_module, permute_gguf_to_hf, permute_hf_to_gguf
from slm.store.objects import ObjectStore

FORMATS = ("slm", "gguf", "gguf-lora", "peft")


@dataclass(frozen=True)
class LoraTarget:
    module: str  # slm's (GGUF) name of the base weight, e.g. blk.3.attn_q.weight
    A: np.ndarray  # (r, in)
    B: np.ndarray  # (out, r), q/k rows in the layout asked for
    scale: float

    @property
    def rank(self) -> int:
        return self.A.shape[0]


def lora_targets(objects: ObjectStore, manifest: AdapterManifest, base: BaseManifest,
                 layout: str, what: str) -> list[LoraTarget]:
    """Every target's A and B (verified bytes), B's q/k rows converted to `layout`."""
    if manifest.kind != "lora":
        raise Incompatible(f"{what} is a {manifest.kind} adapter; only LoRA adapters export to GGUF LoRA or PEFT")
    arch = base.architecture
    heads = qk_heads(arch)
    out = []
    for t in manifest.targets:
        A = tensor_from_bytes(t.tensors["A"], objects.read_verified(t.tensors["A"].digest))
        B = tensor_from_bytes(t.tensors["B"], objects.read_verified(t.tensors["B"].digest))
        role = t.module.split(".")[2] if t.module.startswith("blk.") else ""
        if role in heads and manifest.row_layout != layout:
            # (out, r) rows regrouped per head: see slm.formats.llama
            B = (permute_hf_to_gguf if layout == "gguf" else permute_gguf_to_hf)(B, heads[role])
        out.append(LoraTarget(t.module, np.asarray(A, np.float32), np.ascontiguousarray(B, np.float32), t.scale))
    return out


def _common_alpha(targets: list[LoraTarget]) -> float | None:
    alphas = {np.float32(t.scale * t.rank) for t in targets}
    return float(alphas.pop()) if len(alphas) == 1 else None


def write_gguf_lora(out, manifest: AdapterManifest, targets: list[LoraTarget], base: BaseManifest) -> dict:
    """Into `out`, a file output (slm.store.outputs.OutputFile: its caller commits it)."""
    desc = archs.get(base.architecture["family"])
    alpha = _common_alpha(targets)
    tensors = []
    for t in targets:
        B = t.B if alpha is not None else t.B * np.float32(t.scale)
        tensors += [(f"{t.module}.lora_a", t.A), (f"{t.module}.lora_b", B)]
    meta = {"general.architecture": desc.gguf_arch, "general.type": "adapter", "general.name": "slm export",
            "adapter.type": "lora", "adapter.lora.alpha": float(alpha if alpha is not None else 0.0)}
    size = write_gguf(out, meta, tensors)
    return {"tensors": len(tensors), "bytes": size, "alpha": meta["adapter.lora.alpha"],
            "scales_folded": alpha is None}


def write_peft(out, targets: list[LoraTarget], base: BaseManifest, base_model: str | None = None) -> dict:
    """Into `out`, a directory output (slm.store.outputs.OutputDirectory: its caller commits
    it). `base_model` is the config's base_model_name_or_path: where the base came from (a Hub
    id or a path, slm.formats.base_origin), None when the store does not know. The safetensors bytes are made in memory and written by the output, so a failing write
    is the output's one-line I/O error (exit 12), never a SafetensorError."""
    from safetensors.numpy import save

    desc = archs.get(base.architecture["family"])
    modules = {}
    for t in targets:
        hf = gguf_to_hf_module(t.module, desc)
        if hf is None:
            raise Incompatible(f"{t.module} has no Hugging Face module name in the {desc.family} family")
        modules[hf] = t
    ranks = {t.rank for t in targets}
    r = max(ranks, key=lambda k: sum(t.rank == k for t in targets))  # the most common rank
    alpha = _common_alpha([t for t in targets if t.rank == r]) or float(r)
    rank_pattern = {m: t.rank for m, t in modules.items() if t.rank != r}
    alpha_pattern = {m: float(np.float32(t.scale * t.rank)) for m, t in modules.items()
                     if not np.isclose(t.scale * t.rank, alpha, rtol=0, atol=0)}
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha,
        "rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern,
        "target_modules": sorted(modules), "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
        "use_dora": False, "fan_in_fan_out": False, "init_lora_weights": True, "modules_to_save": None,
        "layers_to_transform": None, "base_model_name_or_path": base_model, "inference_mode": True,
    }
    tensors = {}
    for m, t in modules.items():
        tensors[f"base_model.model.{m}.lora_A.weight"] = np.ascontiguousarray(t.A)
        tensors[f"base_model.model.{m}.lora_B.weight"] = np.ascontiguousarray(t.B)
    weights = save(tensors)
    out.write_file("adapter_model.safetensors", lambda f: f.write(weights))
    text = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    out.write_file("adapter_config.json", lambda f: f.write(text))
    return {"tensors": len(tensors), "r": r, "lora_alpha": alpha, "modules": len(modules),
            "base_model_name_or_path": base_model}
