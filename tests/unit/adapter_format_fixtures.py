"""What the adapter-format tests share (test_adapter_formats.py, test_adapter_formats_handmade.py,
test_adapter_import_with_base.py): the one-line error check, and PEFT directories and GGUF LoRA
files built by hand (safetensors / gguf packages, no torch), and the warnings of torch and PEFT
all three leave aside (PEFT_WARNINGS, each file's pytestmark)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import gguf
from gguf import GGMLQuantizationType as QT

P = "base_model.model."

PEFT_WARNINGS = [
    pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]


def one_line_error(excinfo, *fragments: str) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and msg.strip(), msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


LORA_CFG = {"peft_type": "LORA", "r": 2, "lora_alpha": 6, "target_modules": ["q_proj", "down_proj"],
            "base_model_name_or_path": "some/base", "use_rslora": False}


def _write_peft(d: Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})
    return d


def _lora_tensors(rng, module="model.layers.0.self_attn.q_proj", out=8, inp=8, r=2):
    return {
        f"{P}{module}.lora_A.weight": rng.standard_normal((r, inp)).astype(np.float32),
        f"{P}{module}.lora_B.weight": rng.standard_normal((out, r)).astype(np.float32),
    }


SHIRA_CFG = {"peft_type": "SHIRA", "r": 1, "target_modules": ["q_proj", "v_proj"], "mask_type": "random"}


def _shira(rows, cols, values, module="model.layers.0.self_attn.q_proj", idx_dtype=np.int32):
    return {f"{P}{module}.shira_indices": np.array([rows, cols], dtype=idx_dtype),
            f"{P}{module}.shira_weight": np.asarray(values, dtype=np.float32)}


def _write_gguf_lora(path: Path, tensors: dict[str, np.ndarray], alpha: float | None = 8.0,
                     gtype: str = "adapter", arch: str = "llama", adapter_type: str = "lora",
                     qtypes: dict[str, QT] | None = None, extra=None) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gtype)
    w.add_string("adapter.type", adapter_type)
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", alpha)
    if extra:
        extra(w)
    for name, arr in tensors.items():
        qt = (qtypes or {}).get(name, QT.F32)
        if qt == QT.F32:
            w.add_tensor(name, arr.astype(np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr.astype(np.float32), qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _gguf_pair(rng, name="blk.0.attn_q.weight", out=64, inp=64, r=32):
    return {f"{name}.lora_a": rng.standard_normal((r, inp)).astype(np.float32) * 0.1,
            f"{name}.lora_b": rng.standard_normal((out, r)).astype(np.float32) * 0.1}
