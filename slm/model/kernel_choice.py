"""Which kernels the executor runs, asked without importing it (or NumPy): the memory
estimate of `slm activate` depends on it, and an activation imports nothing it does not need."""

from __future__ import annotations

import os

# What a product's input may be quantized to (NativeKernels.set_activations): float32, the
# exact mode's (`--exact`), within 1e-5 of the reference kernels; int8, the default mode's
# (slm.model.modes), faster and less exact (docs/numerics.md).
ACTIVATION_MODES = ("float32", "int8")


def library_path() -> str | None:
    """The built C kernels (slm/model/_qkernels*.so, compiled at install), or None."""
    import importlib.util

    spec = importlib.util.find_spec("slm.model._qkernels")
    return spec.origin if spec is not None and spec.origin else None


def fused_selected() -> bool:
    """Whether default_kernels() picks the fused C kernels (SLM_KERNELS=reference says no)."""
    return os.environ.get("SLM_KERNELS", "fused") != "reference" and library_path() is not None


# The SIMD features of a kernel build, as the compiler's predefined macros name them
# (setup.py records the macros -march=native defines when it compiles the extension), and
# as /proc/cpuinfo names the CPU's. Best first: the first one present is the build's level.
SIMD_FEATURES = (("avx512vnni", "__AVX512VNNI__"), ("avx512bw", "__AVX512BW__"), ("avx512f", "__AVX512F__"),
                 ("avx_vnni", "__AVXVNNI__"), ("avx2", "__AVX2__"), ("fma", "__FMA__"), ("avx", "__AVX__"),
                 ("f16c", "__F16C__"), ("sse4_2", "__SSE4_2__"), ("asimddp", "__ARM_FEATURE_DOTPROD"),
                 ("neon", "__ARM_NEON"))
LEVELS = ("avx512f", "avx2", "avx", "sse4_2", "neon")  # what a build is called by, best first
BUILD_RECORD = "_qkernels.build.json"  # beside the extension (setup.py writes it)


def build_info() -> dict:
    """The C kernels' build: the extension's path (None: not built; the NumPy reference
    kernels run), the SIMD features it was compiled for and its level (None when the build
    predates setup.py's record of them), whether it is the kernel set in use, and the SIMD
    features of this CPU. Reads two small files; loads nothing."""
    import json
    from pathlib import Path

    path = library_path()
    built_for = None
    if path is not None:
        try:
            macros = set(json.loads((Path(path).parent / BUILD_RECORD).read_text())["macros"])
            built_for = [name for name, macro in SIMD_FEATURES if macro in macros]
        except (OSError, ValueError, KeyError, TypeError):
            built_for = None  # (an extension built before the record existed: rebuild to see it)
    level = next((f for f in LEVELS if built_for and f in built_for), None)
    return {"extension": path, "in_use": fused_selected(), "built_for": built_for,
            "simd": level if built_for is None or level else "generic", "cpu": cpu_features()}


def cpu_features() -> list[str] | None:
    """This CPU's SIMD features among SIMD_FEATURES' (Linux: /proc/cpuinfo's flags); None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags = set(value.split())
                    return [name for name, _ in SIMD_FEATURES if name in flags or (name == "neon" and "asimd" in flags)]
    except OSError:
        return None
    return None
