"""Which kernels the executor runs, asked without importing it (or NumPy): the memory
estimate of `slm activate` depends on it, and an activation imports nothing it does not need."""

from __future__ import annotations

import os


def fused_selected() -> bool:
    """Whether default_kernels() picks the fused C kernels (SLM_KERNELS=reference says no)."""
    import importlib.util

    return os.environ.get("SLM_KERNELS", "fused") != "reference" and \
        importlib.util.find_spec("slm.model._qkernels") is not None
