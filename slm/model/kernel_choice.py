"""Which kernels the executor runs, asked without importing it (or NumPy): the memory
estimate of `slm activate` depends on it, and an activation imports nothing it does not need."""

from __future__ import annotations

import os

# What a product's input may be quantized to (NativeKernels.set_activations): float32, the
# default, within 1e-5 of the reference kernels; int8, opt-in, faster and measurably less exact.
ACTIVATION_MODES = ("float32", "int8")


def library_path() -> str | None:
    """The built C kernels (slm/model/_qkernels*.so, compiled at install), or None."""
    import importlib.util

    spec = importlib.util.find_spec("slm.model._qkernels")
    return spec.origin if spec is not None and spec.origin else None


def fused_selected() -> bool:
    """Whether default_kernels() picks the fused C kernels (SLM_KERNELS=reference says no)."""
    return os.environ.get("SLM_KERNELS", "fused") != "reference" and library_path() is not None
