"""Which kernels the executor runs, asked without importing it (or NumPy): the memory
estimate of `slm activate` depends on it, and an activation imports nothing it does not need."""

from __future__ import annotations

import os

# What a product's input may be quantized to (NativeKernels.set_activations): float32, the
# default, within 1e-5 of the reference kernels; int8, opt-in, faster and measurably less exact.
ACTIVATION_MODES = ("float32", "int8")


def fused_selected() -> bool:
    """Whether default_kernels() picks the fused C kernels (SLM_KERNELS=reference says no)."""
    import importlib.util

    return os.environ.get("SLM_KERNELS", "fused") != "reference" and \
        importlib.util.find_spec("slm.model._qkernels") is not None
