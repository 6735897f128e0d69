"""A PEFT adapter's tensors (adapter_model.safetensors), read per adapter kind.

    key = base_model.model.<module path>.<parameter>, e.g.
          base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight

  LoRA   lora_A.weight (r, in), lora_B.weight (out, r), both as stored; the module's r and
         alpha from rank_pattern / alpha_pattern; scale = alpha / r (alpha / sqrt(r), rsLoRA)
  IA3    ia3_l: (1, in) for a feed-forward module (scales the input), else (out, 1)
  SHiRA  shira_indices (2, k) (row, column) pairs, shira_weight (k,) values

Every key must be understood (a tensor PEFT would drop, or apply differently, is refused), and
every module must be one the config selects. Each module comes out as a `Pending` target: its
tensors, and as much of its (out, in) shape as its own tensors tell (slm.formats.peft.dims
settles the rest).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from slm.arch.roles import LINEAR_ROLES, linear_role
from slm.errors import InvalidInput
from slm.formats.adapter_source import AdapterTarget
from slm.formats.jsonfile import parse_json
from slm.formats.llama import hf_to_gguf_name
from slm.formats.peft.config import ia3_on_input, pattern_value, select_module
from slm.formats.safetensors_io import SafetensorsFile
from slm.formats.untrusted import open_binary

KEY_PREFIX = "base_model.model."
# Stored parameter suffix -> its role, per PEFT type.
_PARAMS = {
    "LORA": {"lora_A.weight": "A", "lora_B.weight": "B"},
    "IA3": {"ia3_l": "vector"},
    "SHIRA": {"shira_weight": "values", "shira_indices": "indices"},
}


@dataclass
class Pending:
    """A target before the base's dimensions are settled."""
    name: str
    module: str  # HF module path
    tensors: dict[str, np.ndarray]
    scale: float = 1.0
    ia3_on: str | None = None
    out: int | None = None
    inp: int | None = None
    dim_sum: int | None = None  # SHiRA: out + in = k / r
    rows_cols: np.ndarray | None = None  # SHiRA: (2, k) int64

    def finish(self, dims: Mapping[str, int], fname: str) -> AdapterTarget:
        """The target, with the dimensions its tensors left open taken from `dims` (H, Q, ...)."""
        out_var, in_var = LINEAR_ROLES[linear_role(self.name)]
        out = dims.get(out_var, 0) if self.out is None else self.out
        inp = dims.get(in_var, 0) if self.inp is None else self.inp
        tensors = self.tensors
        if self.rows_cols is not None:
            tensors = _sparse_tensors(self, out, inp, fname)
        return AdapterTarget(module=self.name, out_features=int(out), in_features=int(inp),
                             tensors=tensors, scale=self.scale, ia3_on=self.ia3_on)


def read_modules(weights: Path, config: dict, peft_type: str) -> list[Pending]:
    """Every module of adapter_model.safetensors, read and checked against the config."""
    fname = str(weights)
    try:
        st = SafetensorsFile(weights)
    except InvalidInput as err:
        raise InvalidInput(f"{weights.parent}: {err}") from err
    try:
        _check_unique_header_keys(st)
        modules = _group_tensors(st, peft_type, fname)
        return [_read_module(st, peft_type, config, hf_module, name, params, fname)
                for name, (hf_module, params) in modules.items()]
    finally:
        st.close()


def _check_unique_header_keys(st: SafetensorsFile) -> None:
    """json.loads keeps the last of two equal keys; a tensor named twice is an error here."""
    try:
        with open_binary(st.path) as f:
            (n,) = struct.unpack("<Q", f.read(8))  # SafetensorsFile checked n against the file
            header = f.read(n)
    except OSError as err:
        raise InvalidInput(f"cannot read {st.path}: {err.strerror}") from err
    try:
        parse_json(header.decode("utf-8"), strict_keys=True)
    except ValueError as err:
        raise InvalidInput(f"{st.path}: malformed safetensors header: {err}") from err


def _explain_foreign(key: str, peft_type: str) -> str:
    if ".lora_magnitude_vector" in key:
        return "is a DoRA magnitude vector (DoRA is not supported)"
    if key.endswith(".lora_B.bias"):
        return "is a LoRA bias (lora_bias is not supported)"
    if ".lora_embedding_A" in key or ".lora_embedding_B" in key:
        return "is an embedding LoRA (only linear layers are supported)"
    if ".lora_A." in key or ".lora_B." in key:
        return "has an unexpected name (PEFT saves <module>.lora_A.weight without the adapter name)"
    if any(s in key for s in (".hada_w", ".lokr_w", ".lora_E")):
        return "belongs to an adapter type other than the config's " + peft_type
    if ".modules_to_save." in key or key.endswith((".weight", ".bias")):
        return ("is a full tensor (modules_to_save, a trained bias or a resized embedding); "
                "slm applies only adapter overlays")
    return f"is not a {peft_type} adapter tensor"


def _group_tensors(st: SafetensorsFile, peft_type: str, fname: str) -> dict[str, tuple[str, dict]]:
    """slm name -> (HF module path, {role: tensor key}); every key must be understood."""
    params = _PARAMS[peft_type]
    modules: dict[str, tuple[str, dict]] = {}
    for key in st.tensors:
        param = next((p for p in params if key.endswith("." + p)), None)
        if param is None:
            raise InvalidInput(f"{fname}: tensor {key} {_explain_foreign(key, peft_type)}")
        module = key[: -len(param) - 1].removeprefix(KEY_PREFIX)
        name = _slm_name(module, key, fname)
        if name in modules and modules[name][0] != module:
            raise InvalidInput(
                f"{fname}: module {name} appears twice ({modules[name][0]} and {module})"
            )
        entry = modules.setdefault(name, (module, {}))
        role = params[param]
        if role in entry[1]:
            raise InvalidInput(f"{fname}: module {name} appears twice ({entry[1][role]} and {key})")
        entry[1][role] = key
    for name, (module, found) in modules.items():
        missing = sorted(set(params.values()) - set(found))
        if missing:
            raise InvalidInput(f"{fname}: module {module} lacks its {', '.join(missing)} tensor")
    return modules


def _slm_name(module: str, key: str, fname: str) -> str:
    name = hf_to_gguf_name(module + ".weight")
    if name is None:
        raise InvalidInput(f"{fname}: tensor {key} targets {module}, not a Llama linear layer")
    if linear_role(name) is None:
        what = "the token embedding" if name == "token_embd.weight" else "a normalisation weight"
        raise InvalidInput(f"{fname}: tensor {key} targets {module}, {what}; only linear layers "
                           f"can carry an adapter")
    return name


def _finite(arr: np.ndarray, key: str, fname: str) -> np.ndarray:
    if not np.isfinite(arr).all():
        raise InvalidInput(f"{fname}: tensor {key} holds non-finite values (NaN or infinity)")
    return arr


def _float(st: SafetensorsFile, key: str, fname: str) -> np.ndarray:
    return _finite(np.ascontiguousarray(st.float32(key), dtype=np.float32), key, fname)


def _read_module(st: SafetensorsFile, peft_type: str, config: dict, module: str, name: str,
                 keys: dict[str, str], fname: str) -> Pending:
    if not select_module(config, module, peft_type):
        raise InvalidInput(
            f"{fname}: the config's target_modules do not select {module} (PEFT would drop its "
            f"tensors)"
        )
    if peft_type == "LORA":
        return _read_lora(st, config, module, name, keys, fname)
    if peft_type == "IA3":
        return _read_ia3(st, config, module, name, keys, fname)
    return _read_shira(st, config, module, name, keys, fname)


def _read_lora(st, config, module, name, keys, fname) -> Pending:
    a_key, b_key = keys["A"], keys["B"]
    A, B = _float(st, a_key, fname), _float(st, b_key, fname)
    if A.ndim != 2 or B.ndim != 2 or 0 in A.shape or 0 in B.shape:
        raise InvalidInput(
            f"{fname}: {module} lora_A {A.shape} / lora_B {B.shape} are not non-empty matrices")
    if A.shape[0] != B.shape[1]:
        raise InvalidInput(
            f"{fname}: {module} has mismatched ranks: lora_A {A.shape} has r={A.shape[0]}, "
            f"lora_B {B.shape} has r={B.shape[1]}"
        )
    r = pattern_value(config.get("rank_pattern") or {}, module, config["r"])
    alpha = float(pattern_value(config.get("alpha_pattern") or {}, module, config["lora_alpha"]))
    if A.shape[0] != r:
        raise InvalidInput(
            f"{fname}: {module} has rank {A.shape[0]} but the config gives it r={r} "
            f"(r / rank_pattern)"
        )
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    return Pending(name, module, {"A": A, "B": B}, scale=scale, out=B.shape[0], inp=A.shape[1])


def _read_ia3(st, config, module, name, keys, fname) -> Pending:
    key = keys["vector"]
    v = _float(st, key, fname)
    on_input = ia3_on_input(config, module)
    if on_input:
        ok, n = v.ndim == 2 and v.shape[0] == 1, v.shape[-1]
    else:
        ok, n = v.ndim == 2 and v.shape[1] == 1, v.shape[0]
    if not ok or n == 0:
        want = "(1, in_features) for a feed-forward module" if on_input else "(out_features, 1)"
        raise InvalidInput(f"{fname}: tensor {key} has shape {v.shape}, expected {want}")
    vector = np.ascontiguousarray(v.reshape(-1))
    if on_input:
        return Pending(name, module, {"vector": vector}, ia3_on="input", inp=n)
    return Pending(name, module, {"vector": vector}, ia3_on="output", out=n)


def _read_shira(st, config, module, name, keys, fname) -> Pending:
    v_key, i_key = keys["values"], keys["indices"]
    values = _float(st, v_key, fname)
    if values.ndim != 1 or values.size == 0:
        raise InvalidInput(f"{fname}: tensor {v_key} has shape {values.shape}, expected (k,)")
    entry = st.tensors[i_key]
    raw = st.raw(i_key)
    if entry.dtype in ("I64", "I32", "I16", "U8", "U16", "U32", "U64", "I8"):
        idx = raw.astype(np.int64)
    elif entry.dtype in ("F32", "F64", "F16", "BF16"):
        # PEFT saves the indices as float32 on Windows and truncates them back on load.
        f = st.float32(i_key).astype(np.float64)
        if not np.isfinite(f).all() or (f != np.floor(f)).any():
            raise InvalidInput(f"{fname}: tensor {i_key} holds non-integer indices")
        idx = f.astype(np.int64)
    else:
        raise InvalidInput(f"{fname}: tensor {i_key} has dtype {entry.dtype}, not integer indices")
    if idx.ndim != 2 or idx.shape != (2, values.size):
        raise InvalidInput(
            f"{fname}: tensor {i_key} has shape {idx.shape}, expected (2, {values.size}) to match {v_key}"
        )
    if (idx < 0).any():
        raise InvalidInput(f"{fname}: tensor {i_key} holds negative indices")
    r = config["r"]
    if values.size % r:
        raise InvalidInput(
            f"{fname}: {module} has {values.size} SHiRA values, not a multiple of r={r} "
            f"(PEFT stores r * (out + in))"
        )
    return Pending(name, module, {"values": values}, dim_sum=values.size // r, rows_cols=idx)


def _sparse_tensors(t: Pending, out: int, inp: int, fname: str) -> dict[str, np.ndarray]:
    rows, cols = t.rows_cols
    if out <= 0 or inp <= 0:
        raise InvalidInput(f"{fname}: cannot place the SHiRA indices of {t.module}: its shape is unknown")
    if rows.max() >= out or cols.max() >= inp:
        raise InvalidInput(
            f"{fname}: SHiRA indices of {t.module} reach ({int(rows.max())}, {int(cols.max())}), "
            f"outside its ({out}, {inp}) weight"
        )
    flat = rows * np.int64(inp) + cols
    values = t.tensors["values"]
    uniq, inverse = np.unique(flat, return_inverse=True)
    if uniq.size != flat.size:  # a position named twice: COO semantics add the values
        summed = np.zeros(uniq.size, dtype=np.float64)
        np.add.at(summed, inverse, values.astype(np.float64))
        coalesced = summed.astype(np.float32)
    else:
        coalesced = np.empty_like(values)
        coalesced[inverse] = values
    return {"indices": uniq.astype(np.int64), "values": np.ascontiguousarray(coalesced, np.float32)}


