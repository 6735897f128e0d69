"""The numerics mode a runtime computes in: part of its identity (recorded in `slm run --json`,
in certificates, in the server's headers and status; docs/numerics.md, "Modes").

- "int8", the default when slm's C kernels are built: each quantized product's input is
  rounded to int8 per 32 values and the block dot products are taken in integers, as
  llama.cpp does. Faster; logits move (agreement with the float64 oracle is measured
  against llama.cpp's own in docs/numerics.md).
- "exact" (`--exact`, `Runtime(exact=True)`): every product in float32, within 1e-3 of
  transformers; `slm verify --numerics` always uses it. Without the C kernels
  (SLM_KERNELS=reference) it is also the default: the default never fails.

In either mode, rows decoded together equal the same requests decoded alone bit for bit.
"""

from __future__ import annotations

from slm.errors import InvalidInput
from slm.model.kernel_choice import fused_selected

EXACT = "exact"
INT8 = "int8"
MODES = (INT8, EXACT)

# the kernels' own word for what a product's input is (Kernels.set_activations)
_ACTIVATIONS = {EXACT: "float32", INT8: "int8"}


def resolve(exact: bool) -> str:
    """The mode a runtime asked for `exact` computes in: "exact", or the default, "int8" when
    the C kernels are in use and "exact" when they are not."""
    if not isinstance(exact, bool):
        raise InvalidInput(f"exact must be True or False, not {exact!r}")
    return EXACT if exact or not fused_selected() else INT8


def use(kernels, mode: str) -> None:
    """Set a kernel set to compute in `mode` (under kernels.lock when the set is shared)."""
    if mode not in _ACTIVATIONS:
        raise InvalidInput(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    kernels.set_activations(_ACTIVATIONS[mode])


def activations_of(mode: str) -> str:
    """The kernels' activations setting for a mode ("float32" or "int8")."""
    return _ACTIVATIONS[mode]


def of_activations(activations: str) -> str:
    """The mode whose kernels take this activations setting (activations_of, the other way)."""
    return next(mode for mode, setting in _ACTIVATIONS.items() if setting == activations)
