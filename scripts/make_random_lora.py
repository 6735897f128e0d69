"""Write a random LoRA adapter in PEFT's on-disk format, with NumPy only (no torch).

    python scripts/make_random_lora.py OUTDIR [--rank 8] [--alpha 16] [--std 0.05] [--seed 0]
        [--hidden 576] [--intermediate 1536] [--layers 30] [--kv-dim 192] [--q-dim N] [--gemma3-270m]

For the demo and for trying slm without a training set-up: the adapter has no purpose but a
visible, deterministic effect on the base's output. It adapts q, k, v, o, gate, up and down of
every layer. The shapes are SmolLM2-135M's unless --hidden/--intermediate/--layers/--kv-dim/
--q-dim say otherwise; --gemma3-270m gives Gemma 3 270M's (the shape flags then refine it).
Prints the adapter's directory.
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
    p.add_argument("outdir", type=Path, help="the adapter's directory (created if missing)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank r (default 8)")
    p.add_argument("--alpha", type=float, default=16.0, help="lora_alpha (default 16)")
    p.add_argument("--std", type=float, default=0.05, help="standard deviation of B's values (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="random seed: the same seed, the same adapter (default 0)")
    p.add_argument("--gemma3-270m", action="store_true", help="Gemma 3 270M's shapes instead of SmolLM2-135M's")
    # None: the preset's value (SmolLM2-135M's, or Gemma 3 270M's with --gemma3-270m)
    p.add_argument("--hidden", type=int, help="hidden size (SmolLM2-135M: 576)")
    p.add_argument("--intermediate", type=int, help="MLP intermediate size (SmolLM2-135M: 1536)")
    p.add_argument("--layers", type=int, help="number of layers (SmolLM2-135M: 30)")
    p.add_argument("--kv-dim", type=int, help="key/value projection width, kv heads x head dim (SmolLM2-135M: 192)")
    p.add_argument("--q-dim", type=int, help="query projection width, heads x head dim (default: the hidden size)")
    a = p.parse_args()
    shape = dict(GEMMA3_270M) if a.gemma3_270m else {}
    shape.update({k: v for k, v in (("hidden", a.hidden), ("intermediate", a.intermediate), ("layers", a.layers),
                                    ("kv_dim", a.kv_dim), ("q_dim", a.q_dim)) if v is not None})
    print(make_random_lora(a.outdir, a.rank, a.alpha, a.std, a.seed, **shape))
