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
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from slm.errors import InvalidInput, NotFound
from slm.formats.adapter_source import AdapterSource, AdapterTarget
from slm.formats.llama import hf_to_gguf_name
from slm.formats.safetensors_io import SafetensorsFile
from slm.formats import patterns as patterns_re
from slm.formats.jsonfile import parse_json, read_json_object

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_NAME = "adapter_model.bin"
MAX_CONFIG_BYTES = 4 << 20
KEY_PREFIX = "base_model.model."

SUPPORTED_PEFT_TYPES = ("LORA", "IA3", "SHIRA")
_KIND = {"LORA": "lora", "IA3": "ia3", "SHIRA": "sparse"}
# PEFT's per-architecture defaults when target_modules is None (utils/constants.py, "llama").
_DEFAULT_TARGETS = {"LORA": ["q_proj", "v_proj"], "IA3": ["k_proj", "v_proj", "down_proj"],
                    "SHIRA": ["q_proj", "v_proj"]}
_DEFAULT_IA3_FEEDFORWARD = ["down_proj"]
# Stored parameter suffix -> its role, per PEFT type.
_PARAMS = {
    "LORA": {"lora_A.weight": "A", "lora_B.weight": "B"},
    "IA3": {"ia3_l": "vector"},
    "SHIRA": {"shira_weight": "values", "shira_indices": "indices"},
}

# The Llama linear layers an adapter may modify, by the role part of slm's name, with their
# (out, in) dimensions in terms of the base's sizes: H hidden, Q = num_heads * head_dim,
# KV = num_kv_heads * head_dim, F intermediate, V vocabulary.
LINEAR_ROLES: dict[str, tuple[str, str]] = {
    "attn_q": ("Q", "H"), "attn_k": ("KV", "H"), "attn_v": ("KV", "H"), "attn_output": ("H", "Q"),
    "ffn_gate": ("F", "H"), "ffn_up": ("F", "H"), "ffn_down": ("H", "F"), "output": ("V", "H"),
}
_ROLE_ORDER = list(LINEAR_ROLES)
_DIM_FIELDS = {"H": "hidden_size", "F": "intermediate_size", "V": "vocab_size"}
_DIM_WORDS = {"H": "hidden size", "Q": "query width (num_heads * head_dim)",
              "KV": "key/value width (num_kv_heads * head_dim)", "F": "intermediate size",
              "V": "vocabulary size"}
_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")

# LoRA initialisations that rewrite the base weights (W -= scale * B A and the like), so the
# adapter is only meaningful on top of that modified base.
_BASE_MODIFYING_INITS = ("pissa", "corda", "olora", "loftq", "lora_ga")
# LoRA config fields that turn on something other than y = W x + s B A x; any truthy value
# is refused.
_LORA_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)",
    "lora_bias": "a trained LoRA bias (lora_bias)",
    "layer_replication": "layer replication (layer_replication)",
    "target_parameters": "LoRA on raw parameters (target_parameters)",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "use_bdlora": "block-diagonal LoRA (use_bdlora)",
    "arrow_config": "Arrow routing (arrow_config)",
    "kasa_config": "KaSA (kasa_config)",
    "monteclora_config": "MonteCLoRA (monteclora_config)",
    "velora_config": "VeLoRA (velora_config)",
    "modules_to_save": "training full modules (modules_to_save)",
}


# ------------------------------------------------------------------------------------- public

def is_peft_dir(path) -> bool:
    """A directory holding adapter_config.json (whether or not slm can read the rest)."""
    try:
        p = Path(path)
        return p.is_dir() and (p / CONFIG_NAME).is_file()
    except OSError:
        return False


def read_peft_adapter(path: Path, base_shapes: Mapping[str, tuple[int, int]] | None = None
                      ) -> AdapterSource:
    """Read a PEFT LoRA / IA³ / SHiRA adapter directory.

    `base_shapes` (optional): slm tensor name -> NumPy shape (out, in) of the base the adapter
    will be applied to. Without it, each target's (out_features, in_features) is worked out
    from the tensors where the file determines it, and is 0 where it does not (an IA³ vector
    gives only one of the two). SHiRA needs in_features to turn (row, column) pairs into flat
    positions: without base_shapes it is solved from k = r * (out + in) over the adapter's
    modules, assuming a square attn_q (num_heads * head_dim == hidden_size) when the sums
    alone do not determine it; the hidden size that assumption yields is put in `requires`,
    so a base that breaks the assumption fails the hidden-size check.
    """
    folder = _adapter_folder(Path(path))
    config = _load_config(folder)
    peft_type = _peft_type(config, folder)
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        if (folder / PICKLE_NAME).exists():
            raise InvalidInput(
                f"{folder / PICKLE_NAME}: pickled PEFT weights are refused (loading a pickle can "
                f"run arbitrary code); re-save the adapter with safe_serialization=True"
            )
        raise InvalidInput(f"{folder}: no {WEIGHTS_NAME} next to {CONFIG_NAME}")
    if peft_type == "LORA":
        _check_lora_config(config, folder)
    elif peft_type == "IA3":
        _check_common_config(config, folder, "IA3")
    else:
        _check_common_config(config, folder, "SHIRA")
        _positive_int(config, "r", folder, required=True)

    fname = str(weights)
    try:
        st = SafetensorsFile(weights)
    except InvalidInput as err:
        raise InvalidInput(f"{folder}: {err}") from err
    try:
        _check_unique_header_keys(st)
        modules = _group_tensors(st, peft_type, fname)
        pending = [_read_module(st, peft_type, config, hf_module, name, params, fname)
                   for name, (hf_module, params) in modules.items()]
    finally:
        st.close()
    if not pending:
        raise InvalidInput(f"{weights}: the adapter is empty (no {peft_type} tensors)")

    dims = _Dims(fname)
    if base_shapes is not None:
        for t in pending:
            dims.fix_from_base(t, base_shapes)
    else:
        dims.solve(pending)
    targets = [t.finish(dims, fname) for t in sorted(pending, key=_target_order)]

    # No family: PEFT saves none, and the module names (q_proj ... down_proj under
    # model.layers.N) are the same in every slm.arch family, as are their row layouts.
    requires: dict[str, Any] = {}
    for var, field_name in _DIM_FIELDS.items():
        if var in dims.values:
            requires[field_name] = dims.values[var]
    return AdapterSource(format="peft", kind=_KIND[peft_type], row_layout="hf", targets=targets,
                         requires=requires, config=config)


def pattern_value(patterns: Mapping[str, Any], module_key: str, default):
    """rank_pattern / alpha_pattern lookup as PEFT does it (utils/other.py get_pattern_key):
    the first key, in the dict's order, that is a regular expression matching a whole trailing
    run of dotted components of the module name ("q_proj" matches "model.layers.0.self_attn.
    q_proj", "layers\\.0\\..*k_proj" matches layer 0's k_proj) gives the value; else default."""
    for pattern in patterns:
        if patterns_re.fullmatch(rf"(?:.*\.)?(?:{pattern})", module_key, f"pattern {pattern!r}"):
            return patterns[pattern]
    return default


def select_module(config: Mapping[str, Any], module_key: str, peft_type: str = "LORA") -> bool:
    """Whether PEFT would put an adapter on `module_key` (e.g. "model.layers.3.mlp.up_proj"),
    following tuners_utils.check_target_module_exists for a Llama causal LM."""
    exclude = config.get("exclude_modules")
    if isinstance(exclude, str) and exclude:
        if _fullmatch(exclude, module_key):
            return False
    elif exclude:
        if module_key in exclude or any(module_key.endswith("." + e) for e in exclude):
            return False
    target = config.get("target_modules")
    if target is None:
        target = _DEFAULT_TARGETS.get(peft_type, [])
    if isinstance(target, str):
        if target.lower() == "all-linear":
            # every nn.Linear except the output embedding (lm_head)
            return module_key != "lm_head"
        return _fullmatch(target, module_key)
    if module_key in target:
        return True  # named exactly: layers_to_transform does not apply (as in PEFT)
    if not any(module_key.endswith("." + t) for t in target):
        return False
    layers = config.get("layers_to_transform")
    if layers is None or layers == []:
        return True
    index = _layer_index(module_key, config.get("layers_pattern"))
    if index is None:
        return False
    return index == layers if isinstance(layers, int) else index in layers


def ia3_on_input(config: Mapping[str, Any], module_key: str) -> bool:
    """IA³: whether the module is a feed-forward one (vector scales its input), as
    ia3/model.py _check_target_module_feedforward decides: a string is a full-match regex,
    a list matches by plain suffix (no dot boundary)."""
    ff = config.get("feedforward_modules")
    if ff is None:
        ff = _DEFAULT_IA3_FEEDFORWARD
    if isinstance(ff, str):
        return _fullmatch(ff, module_key)
    return any(module_key.endswith(f) for f in ff)


def linear_role(name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'attn_q', 'output.weight' -> 'output'; None if not a Llama
    linear layer slm can put an adapter on."""
    if name == "output.weight":
        return "output"
    m = _NAME.fullmatch(name)
    if m and m.group(2) in LINEAR_ROLES:
        return m.group(2)
    return None


def requires_from_lora(targets: list[AdapterTarget], family: str) -> dict[str, Any]:
    """What a GGUF LoRA says of its base: its family (general.architecture) and the sizes its
    fully-shaped targets reveal."""
    found: dict[str, int] = {}
    for t in targets:
        out_var, in_var = LINEAR_ROLES[linear_role(t.module)]
        for var, value in ((out_var, t.out_features), (in_var, t.in_features)):
            if var in _DIM_FIELDS:
                found.setdefault(var, value)
    requires: dict[str, Any] = {"family": family}
    for var, field_name in _DIM_FIELDS.items():
        if var in found:
            requires[field_name] = found[var]
    return requires


def target_order(name: str) -> tuple[int, int]:
    m = _NAME.fullmatch(name)
    role = linear_role(name)
    layer = int(m.group(1)) if m else 1 << 30
    return layer, _ROLE_ORDER.index(role) if role else len(_ROLE_ORDER)


# ------------------------------------------------------------------------------------- config

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


def _load_config(folder: Path) -> dict:
    return read_json_object(folder / CONFIG_NAME, "adapter config", MAX_CONFIG_BYTES, strict_keys=True)


def _peft_type(config: dict, folder: Path) -> str:
    value = config.get("peft_type")
    if not isinstance(value, str):
        raise InvalidInput(f"{folder / CONFIG_NAME}: missing or invalid peft_type")
    peft_type = value.upper()
    if peft_type not in SUPPORTED_PEFT_TYPES:
        raise InvalidInput(
            f"{folder / CONFIG_NAME}: PEFT type {value} is not supported "
            f"(slm reads LORA, IA3 and SHIRA adapters)"
        )
    return peft_type


def _where(folder: Path) -> str:
    return str(folder / CONFIG_NAME)


def _truthy(value) -> bool:
    return value not in (None, False, 0, "", [], {})


def _check_common_config(config: dict, folder: Path, peft_type: str) -> None:
    where = _where(folder)
    if _truthy(config.get("modules_to_save")):
        raise InvalidInput(
            f"{where}: modules_to_save {config['modules_to_save']!r} stores full trained modules; "
            f"slm applies only adapter overlays"
        )
    target = _module_selector(config, "target_modules", where)
    _module_selector(config, "exclude_modules", where)
    layers = config.get("layers_to_transform")
    if layers is not None and not (
        (isinstance(layers, int) and not isinstance(layers, bool))
        or (isinstance(layers, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                             for i in layers))):
        raise InvalidInput(f"{where}: layers_to_transform must be an integer or a list of integers")
    pattern = config.get("layers_pattern")
    if pattern is not None and not (isinstance(pattern, str) or (
            isinstance(pattern, list) and all(isinstance(p, str) for p in pattern))):
        raise InvalidInput(f"{where}: layers_pattern must be a string or a list of strings")
    if isinstance(target, str) and (_truthy(layers) or _truthy(pattern)):
        raise InvalidInput(f"{where}: layers_to_transform/layers_pattern cannot be combined with "
                           f"a regular-expression target_modules")
    if peft_type == "IA3":
        _module_selector(config, "feedforward_modules", where)


def _module_selector(config: dict, key: str, where: str):
    """A PEFT module selector: a regular expression, a list of names, or null. Checked, and
    a non-empty regular expression compiled, before anything is matched against it."""
    value = config.get(key)
    if not (value is None or isinstance(value, str)
            or (isinstance(value, list) and all(isinstance(t, str) for t in value))):
        raise InvalidInput(f"{where}: {key} must be a string, a list of strings or null")
    if isinstance(value, str) and value:
        _compile(value, where, key)
    return value


def _check_lora_config(config: dict, folder: Path) -> None:
    where = _where(folder)
    for key, what in _LORA_UNSUPPORTED.items():
        if _truthy(config.get(key)):
            raise InvalidInput(f"{where}: {what} is not supported (plain LoRA only)")
    bias = config.get("bias", "none")
    if bias != "none":
        raise InvalidInput(f"{where}: bias={bias!r} trains the base biases; only bias='none' is supported")
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(_BASE_MODIFYING_INITS):
        raise InvalidInput(
            f"{where}: init_lora_weights={init!r} rewrites the base weights, so the adapter does "
            f"not apply to the original base; convert it to a plain LoRA first"
        )
    _check_common_config(config, folder, "LORA")
    _positive_int(config, "r", folder, required=True)
    _number(config.get("lora_alpha"), where, "lora_alpha")
    for key in ("use_rslora", "fan_in_fan_out"):
        if not isinstance(config.get(key, False), bool):
            raise InvalidInput(f"{where}: {key} must be true or false")
    for key, check in (("rank_pattern", "rank"), ("alpha_pattern", "alpha")):
        patterns = config.get(key) or {}
        if not isinstance(patterns, dict):
            raise InvalidInput(f"{where}: {key} must be an object")
        for pattern, value in patterns.items():
            patterns_re.compile_pattern(rf"(?:.*\.)?(?:{pattern})", f"{where}: {key} key")
            if check == "rank":
                if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                    raise InvalidInput(
                        f"{where}: rank_pattern[{pattern!r}]={value!r} is not a positive integer")
            else:
                _number(value, where, f"alpha_pattern[{pattern!r}]")


def _positive_int(config: dict, key: str, folder: Path, required: bool) -> None:
    value = config.get(key)
    if value is None and not required:
        return
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise InvalidInput(f"{_where(folder)}: {key}={value!r} is not a positive integer")


def _number(value, where: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{where}: {what}={value!r} is not a finite number")
    return float(value)


def _compile(pattern: str, where: str, what: str):
    return patterns_re.compile_pattern(pattern, f"{where}: {what}")


def _fullmatch(pattern: str, text: str) -> bool:
    return patterns_re.fullmatch(pattern, text)


def _layer_index(module_key: str, layers_pattern) -> int | None:
    """The first numbered component after a (pattern-named) component, as PEFT finds it."""
    if not layers_pattern:
        m = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", module_key)
    else:
        patterns = [layers_pattern] if isinstance(layers_pattern, str) else layers_pattern
        m = None
        for pattern in patterns:
            m = patterns_re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", module_key,
                                  f"layers_pattern {pattern!r}")
            if m:
                break
    return int(m.group("idx")) if m else None


# ------------------------------------------------------------------------------------ tensors

def _check_unique_header_keys(st: SafetensorsFile) -> None:
    """json.loads keeps the last of two equal keys; a tensor named twice is an error here."""
    try:
        with open(st.path, "rb") as f:
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


@dataclass
class _Pending:
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

    def finish(self, dims: "_Dims", fname: str) -> AdapterTarget:
        out_var, in_var = LINEAR_ROLES[linear_role(self.name)]
        out = dims.values.get(out_var, 0) if self.out is None else self.out
        inp = dims.values.get(in_var, 0) if self.inp is None else self.inp
        tensors = self.tensors
        if self.rows_cols is not None:
            tensors = _sparse_tensors(self, out, inp, fname)
        return AdapterTarget(module=self.name, out_features=int(out), in_features=int(inp),
                             tensors=tensors, scale=self.scale, ia3_on=self.ia3_on)


def _target_order(t: _Pending) -> tuple[int, int]:
    return target_order(t.name)


def _finite(arr: np.ndarray, key: str, fname: str) -> np.ndarray:
    if not np.isfinite(arr).all():
        raise InvalidInput(f"{fname}: tensor {key} holds non-finite values (NaN or infinity)")
    return arr


def _float(st: SafetensorsFile, key: str, fname: str) -> np.ndarray:
    return _finite(np.ascontiguousarray(st.float32(key), dtype=np.float32), key, fname)


def _read_module(st: SafetensorsFile, peft_type: str, config: dict, module: str, name: str,
                 keys: dict[str, str], fname: str) -> _Pending:
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


def _read_lora(st, config, module, name, keys, fname) -> _Pending:
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
    return _Pending(name, module, {"A": A, "B": B}, scale=scale, out=B.shape[0], inp=A.shape[1])


def _read_ia3(st, config, module, name, keys, fname) -> _Pending:
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
        return _Pending(name, module, {"vector": vector}, ia3_on="input", inp=n)
    return _Pending(name, module, {"vector": vector}, ia3_on="output", out=n)


def _read_shira(st, config, module, name, keys, fname) -> _Pending:
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
    return _Pending(name, module, {"values": values}, dim_sum=values.size // r, rows_cols=idx)


def _sparse_tensors(t: _Pending, out: int, inp: int, fname: str) -> dict[str, np.ndarray]:
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


# ------------------------------------------------------------------------------- dimensions

class _Dims:
    """The base's sizes (H, Q, KV, F, V) as far as the adapter tensors determine them."""

    def __init__(self, fname: str):
        self.fname = fname
        self.values: dict[str, int] = {}
        self.source: dict[str, str] = {}

    def set(self, var: str, value: int, source: str) -> bool:
        if value <= 0:
            raise InvalidInput(f"{self.fname}: {source} implies a {_DIM_WORDS[var]} of {value}")
        if var in self.values:
            if self.values[var] != value:
                raise InvalidInput(
                    f"{self.fname}: inconsistent shapes: {self.source[var]} gives a "
                    f"{_DIM_WORDS[var]} of {self.values[var]}, {source} gives {value}"
                )
            return False
        self.values[var], self.source[var] = value, source
        return True

    def solve(self, pending: list[_Pending]) -> None:
        sums = []
        for t in pending:
            out_var, in_var = LINEAR_ROLES[linear_role(t.name)]
            if t.out is not None:
                self.set(out_var, t.out, t.module)
            if t.inp is not None:
                self.set(in_var, t.inp, t.module)
            if t.dim_sum is not None:
                sums.append((out_var, in_var, t.dim_sum, t.module))
        self._propagate(sums)
        if any(t.dim_sum is not None and LINEAR_ROLES[linear_role(t.name)][1] not in self.values
               for t in pending):
            # The sums leave one degree of freedom; Llama checkpoints have a square attn_q.
            for out_var, in_var, total, module in sums:
                if {out_var, in_var} == {"Q", "H"} and "H" not in self.values and "Q" not in self.values:
                    if total % 2:
                        raise InvalidInput(f"{self.fname}: {module} has an odd out + in = {total}; "
                                           f"cannot infer the hidden size (pass the base's shapes)")
                    self.set("H", total // 2, f"{module} (assuming num_heads * head_dim == hidden_size)")
                    self.set("Q", total // 2, f"{module} (assuming a square attn_q)")
                    break
            self._propagate(sums)
        for t in pending:
            in_var = LINEAR_ROLES[linear_role(t.name)][1]
            if t.dim_sum is not None and in_var not in self.values:
                raise InvalidInput(
                    f"{self.fname}: cannot tell the shape of {t.module} from the adapter alone "
                    f"(SHiRA without attn_q/attn_output); pass the base's tensor shapes"
                )

    def _propagate(self, sums) -> None:
        changed = True
        while changed:
            changed = False
            for out_var, in_var, total, module in sums:
                if out_var in self.values and in_var not in self.values:
                    changed |= self.set(in_var, total - self.values[out_var], module)
                elif in_var in self.values and out_var not in self.values:
                    changed |= self.set(out_var, total - self.values[in_var], module)
                elif out_var in self.values and in_var in self.values:
                    if self.values[out_var] + self.values[in_var] != total:
                        raise InvalidInput(
                            f"{self.fname}: {module} holds {total} * r SHiRA values, but its shape "
                            f"is ({self.values[out_var]}, {self.values[in_var]})"
                        )

    def fix_from_base(self, t: _Pending, base_shapes: Mapping[str, tuple[int, int]]) -> None:
        shape = base_shapes.get(t.name)
        if shape is None or len(shape) != 2:
            raise InvalidInput(f"{self.fname}: the base has no linear weight {t.name} for {t.module}")
        out, inp = int(shape[0]), int(shape[1])
        if (t.out is not None and t.out != out) or (t.inp is not None and t.inp != inp) or (
                t.dim_sum is not None and t.dim_sum != out + inp):
            got = (t.out, t.inp) if t.dim_sum is None else f"out + in = {t.dim_sum}"
            raise InvalidInput(f"{self.fname}: {t.module} does not fit the base's {t.name} "
                               f"{(out, inp)} (adapter has {got})")
        t.out, t.inp = out, inp
        out_var, in_var = LINEAR_ROLES[linear_role(t.name)]
        self.set(out_var, out, t.name)
        self.set(in_var, inp, t.name)


__all__ = [
    "CONFIG_NAME", "WEIGHTS_NAME", "PICKLE_NAME", "LINEAR_ROLES", "SUPPORTED_PEFT_TYPES",
    "is_peft_dir", "read_peft_adapter", "pattern_value", "select_module", "ia3_on_input",
    "linear_role", "requires_from_lora", "target_order",
]
