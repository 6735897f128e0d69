"""PEFT adapter directories (as `PeftModel.save_pretrained` writes them, peft 0.21) as AdapterSource.

    DIR/adapter_config.json          {"peft_type": "LORA" | "IA3" | "SHIRA", "target_modules": ..., ...}
    DIR/adapter_model.safetensors    one tensor per adapter parameter, keyed
        base_model.model.<module path>.<parameter>
    e.g. base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight

The adapter name ("default", or whatever name was given) is never part of a saved key: PEFT
strips it on save and re-inserts it on load. (A non-default adapter is saved into a
sub-directory named after it: point slm at that sub-directory.) `adapter_model.bin`, the
legacy pickle format, is refused without being opened: unpickling runs arbitrary code.

What each supported type means, exactly as PEFT 0.21 applies it in forward (eval mode):

  LoRA   (tuners/lora/layer.py Linear.forward)  y = W x + scale * B (A x)
         A = lora_A.weight (r, in), B = lora_B.weight (out, r), both as stored.
         scale = alpha / r, or alpha / sqrt(r) with use_rslora; r and alpha are resolved per
         module from rank_pattern / alpha_pattern (see `pattern_value`). fan_in_fan_out is
         forced to False by PEFT for torch.nn.Linear (it only matters for GPT-2's Conv1D),
         and lora_A / lora_B are nn.Linear layers whatever it says, so the stored tensors
         are always (r, in) and (out, r): the flag is recorded and otherwise ignored.
  IA³    (tuners/ia3/layer.py Linear.forward)  ia3_l is (1, in) for a module matched by
         feedforward_modules: y = W (l * x) ("input"); otherwise (out, 1): y = l * (W x)
         ("output", the base layer's bias included: Qwen2's q/k/v biases are scaled too).
  SHiRA  (tuners/shira/layer.py)  y = (W + S) x with S a sparse (out, in) matrix:
         shira_indices (2, k) int32 holds (row, column) pairs and shira_weight (k,) the values
         (S = sparse_coo_tensor(indices, weight * scaling); scaling is 1.0 and not saved).
         The indices ARE saved: on load PEFT replaces the mask it drew from random_seed with
         the saved indices, so reading needs no torch and no RNG. k = r * (out + in).
         Duplicate positions would add up (COO semantics); slm coalesces them by summing.

Which modules get an adapter: PEFT's from_pretrained matches module names against the config
(target_modules, exclude_modules, layers_to_transform / layers_pattern; `select_module`
reimplements those rules) and then loads the tensors into the matched modules. A tensor for a
module the config does not match would be silently dropped by PEFT; slm refuses such a file.

The job is split by module: config.py (the config and which modules it selects), tensors.py
(the tensors, per adapter kind), dims.py (the base dimensions the tensors leave open).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from slm.arch.roles import DIM_FIELDS, target_order
from slm.errors import InvalidInput, NotFound
from slm.formats.adapter_source import AdapterSource
from slm.formats.peft import dims as peft_dims
from slm.formats.peft.config import (CONFIG_NAME, SUPPORTED_PEFT_TYPES, ia3_on_input, load_config,
                                     pattern_value, select_module)
from slm.formats.peft.tensors import KEY_PREFIX, read_modules

WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_NAME = "adapter_model.bin"
_KIND = {"LORA": "lora", "IA3": "ia3", "SHIRA": "sparse"}


def is_peft_dir(path) -> bool:
    """A directory holding adapter_config.json (whether or not slm can read the rest)."""
    try:
        p = Path(path)
        return p.is_dir() and (p / CONFIG_NAME).is_file()
    except OSError:
        return False


def read_peft_adapter(path: Path, base_shapes: Mapping[str, tuple[int, ...]] | None = None
                      ) -> AdapterSource:
    """Read a PEFT LoRA / IA³ / SHiRA adapter directory.

    `base_shapes` (optional): slm tensor name -> NumPy shape (out, in) of the base the adapter
    will be applied to; every target is then shaped, and checked, by the base (dims.from_base).
    Without it, the shapes are worked out from the adapter alone (dims.solve), 0 where it does
    not determine them.
    """
    folder = _adapter_folder(Path(path))
    config, peft_type = load_config(folder)
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        if (folder / PICKLE_NAME).exists():
            raise InvalidInput(
                f"{folder / PICKLE_NAME}: pickled PEFT weights are refused (loading a pickle can "
                f"run arbitrary code); re-save the adapter with safe_serialization=True"
            )
        raise InvalidInput(f"{folder}: no {WEIGHTS_NAME} next to {CONFIG_NAME}")
    pending = read_modules(weights, config, peft_type)
    fname = str(weights)
    if not pending:
        raise InvalidInput(f"{weights}: the adapter is empty (no {peft_type} tensors)")
    if base_shapes is not None:
        dims = peft_dims.from_base(pending, base_shapes, fname)
    else:
        dims = peft_dims.solve(pending, fname)
    targets = [t.finish(dims.values, fname) for t in sorted(pending, key=lambda t: target_order(t.name))]

    # No family: PEFT saves none, and the module names (q_proj ... down_proj under
    # model.layers.N) are the same in every slm.arch family, as are their row layouts.
    requires: dict[str, Any] = {field_name: dims.values[var]
                                for var, field_name in DIM_FIELDS.items() if var in dims.values}
    return AdapterSource(format="peft", kind=_KIND[peft_type], row_layout="hf", targets=targets,
                         requires=requires, config=config)


def _adapter_folder(path: Path) -> Path:
    if path.is_file() and path.name in (CONFIG_NAME, WEIGHTS_NAME, PICKLE_NAME):
        path = path.parent
    if not path.exists():
        raise NotFound(f"no such adapter directory: {path}")
    if not path.is_dir():
        raise InvalidInput(f"{path}: not a PEFT adapter directory")
    if not (path / CONFIG_NAME).is_file():
        try:
            subs = sorted(p.name for p in path.iterdir() if (p / CONFIG_NAME).is_file())
        except OSError:
            subs = []
        hint = f" (adapters in sub-directories: {', '.join(subs[:5])}; name one)" if subs else ""
        raise InvalidInput(f"{path}: no {CONFIG_NAME}, so not a PEFT adapter directory{hint}")
    return path


__all__ = [
    "CONFIG_NAME", "WEIGHTS_NAME", "PICKLE_NAME", "KEY_PREFIX", "SUPPORTED_PEFT_TYPES",
    "is_peft_dir", "read_peft_adapter", "pattern_value", "select_module", "ia3_on_input",
]
