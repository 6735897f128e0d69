"""Write a random LoRA adapter in PEFT's on-disk format, with NumPy only (no torch).

    python scripts/make_random_lora.py OUTDIR [--rank 8] [--alpha 16] [--std 0.05] [--seed 0]

For the demo and for trying slm without a training set-up: the adapter has no purpose but a
visible, deterministic effect on SmolLM2's output. The shapes are SmolLM2-135M's unless
--hidden/--intermediate/--layers/--kv-dim say otherwise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

MODULES = {  # HF module -> (out_features, in_features) as functions of the sizes
    "self_attn.q_proj": lambda h, f, kv, q: (q, h),
    "self_attn.k_proj": lambda h, f, kv, q: (kv, h),
    "self_attn.v_proj": lambda h, f, kv, q: (kv, h),
    "self_attn.o_proj": lambda h, f, kv, q: (h, q),
    "mlp.gate_proj": lambda h, f, kv, q: (f, h),
    "mlp.up_proj": lambda h, f, kv, q: (f, h),
    "mlp.down_proj": lambda h, f, kv, q: (h, f),
}
# Gemma 3 270M: hidden 640, ffn 2048, 18 layers, 4 query heads and 1 key/value head of 256
GEMMA3_270M = {"hidden": 640, "intermediate": 2048, "layers": 18, "kv_dim": 256, "q_dim": 1024}


def make_random_lora(outdir: Path, rank: int = 8, alpha: float = 16.0, std: float = 0.05,
                     seed: int = 0, hidden: int = 576, intermediate: int = 1536, layers: int = 30,
                     kv_dim: int = 192, q_dim: int | None = None) -> Path:
    """q_dim: the query projection's width (heads x head_dim) when it is not `hidden`."""
    rng = np.random.Generator(np.random.PCG64(seed))
    tensors = {}
    for layer in range(layers):
        for module, dims in MODULES.items():
            out_f, in_f = dims(hidden, intermediate, kv_dim, q_dim or hidden)
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, in_f)) / np.sqrt(in_f)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (std * rng.standard_normal((out_f, rank))).astype(np.float32)
    outdir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(outdir / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "use_dora": False,
        "fan_in_fan_out": False, "init_lora_weights": True, "rank_pattern": {}, "alpha_pattern": {},
        "target_modules": sorted(m.split(".")[1] for m in MODULES), "modules_to_save": None,
        "layers_to_transform": None, "base_model_name_or_path": "SmolLM2-135M-Instruct",
    }
    (outdir / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return outdir


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path)
    for flag, kind, default in [("--rank", int, 8), ("--alpha", float, 16.0), ("--std", float, 0.05),
                                ("--seed", int, 0)]:
        p.add_argument(flag, type=kind, default=default)
    a = p.parse_args()
    print(make_random_lora(a.outdir, a.rank, a.alpha, a.std, a.seed))
