"""A PEFT adapter's adapter_config.json: read, checked, and which modules it selects.

PEFT's from_pretrained matches module names against the config (target_modules,
exclude_modules, layers_to_transform / layers_pattern) and loads the saved tensors into the
matched modules; `select_module` reimplements those rules (peft 0.21, tuners_utils.py), and
`pattern_value` the per-module rank_pattern / alpha_pattern lookup. Every field slm reads is
checked here, before a tensor is opened; a config asking for something other than the three
supported adapter types' plain forward pass is refused.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping

from slm.errors import InvalidInput
from slm.formats import patterns as patterns_re
from slm.formats.jsonfile import read_json_object

CONFIG_NAME = "adapter_config.json"
MAX_CONFIG_BYTES = 4 << 20

SUPPORTED_PEFT_TYPES = ("LORA", "IA3", "SHIRA")
# PEFT's per-architecture defaults when target_modules is None (utils/constants.py, "llama").
_DEFAULT_TARGETS = {"LORA": ["q_proj", "v_proj"], "IA3": ["k_proj", "v_proj", "down_proj"],
                    "SHIRA": ["q_proj", "v_proj"]}
_DEFAULT_IA3_FEEDFORWARD = ["down_proj"]

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



def load_config(folder: Path) -> tuple[dict, str]:
    """The checked config of an adapter directory and its PEFT type (LORA, IA3 or SHIRA)."""
    config = read_json_object(folder / CONFIG_NAME, "adapter config", MAX_CONFIG_BYTES, strict_keys=True)
    peft_type = _peft_type(config, folder)
    if peft_type == "LORA":
        _check_lora_config(config, folder)
    elif peft_type == "IA3":
        _check_common_config(config, folder, "IA3")
    else:
        _check_common_config(config, folder, "SHIRA")
        _positive_int(config, "r", folder, required=True)
    return config, peft_type


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


