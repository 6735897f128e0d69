"""Which kernels the executor runs, asked without importing it (or NumPy): the memory
estimate of `slm activate` depends on it, and an activation imports nothing it does not need."""

from __future__ import annotations

import os

# What a product's input may be quantized to (NativeKernels.set_activations): float32, the
# exact mode's (`--exact`), within 1e-5 of the reference kernels; int8, the default mode's
# (slm.model.modes), faster and less exact (docs/numerics.md).
ACTIVATION_MODES = ("float32", "int8")


def library_path() -> str | None:
    """The C kernels of the CPU variant to load (slm.model.cpu_variants: the best one this CPU
    runs, or SLM_CPU's), or None when they were not built at install."""
    from slm.model import cpu_variants

    return cpu_variants.library_path()


def fused_selected() -> bool:
    """Whether default_kernels() picks the fused C kernels (SLM_KERNELS=reference says no)."""
    return os.environ.get("SLM_KERNELS", "fused") != "reference" and library_path() is not None


# The SIMD features of a kernel build: slm's name, the compiler's predefined macro (setup.py
# records the macros a variant's flags define when it compiles the extension), and the flag
# /proc/cpuinfo names the CPU's by (which spells some with an underscore slm's names lack).
# Best first: the first one present is the build's level.
SIMD_FEATURES = (("avx512vnni", "__AVX512VNNI__", "avx512_vnni"), ("avx512bw", "__AVX512BW__", "avx512bw"),
                 ("avx512f", "__AVX512F__", "avx512f"), ("avx_vnni", "__AVXVNNI__", "avx_vnni"),
                 ("avx2", "__AVX2__", "avx2"), ("fma", "__FMA__", "fma"), ("avx", "__AVX__", "avx"),
                 ("f16c", "__F16C__", "f16c"), ("sse4_2", "__SSE4_2__", "sse4_2"),
                 ("asimddp", "__ARM_FEATURE_DOTPROD", "asimddp"), ("neon", "__ARM_NEON", "asimd"))
LEVELS = ("avx512f", "avx2", "avx", "sse4_2", "neon")  # what a build is called by, best first
BUILD_RECORD = ".build.json"  # a variant's record: its module's name and this, beside it (setup.py writes it)


def build_info() -> dict:
    """The C kernels' build: the CPU variant loaded (slm.model.cpu_variants) and its extension's
    path (None: not built; the NumPy reference kernels run), the variants built and those this
    CPU runs (best first), the SIMD features the variant was compiled for and its level (None
    when the build predates setup.py's record of them), whether it is the kernel set in use,
    and the SIMD features of this CPU. Reads small files and asks the CPU; runs no kernel."""
    import json
    from pathlib import Path

    from slm.model import cpu_variants

    path = library_path()
    built_for = None
    if path is not None:
        record = Path(path).parent / (Path(path).name.split(".")[0] + BUILD_RECORD)
        try:
            macros = set(json.loads(record.read_text())["macros"])
            built_for = [name for name, macro, _ in SIMD_FEATURES if macro in macros]
        except (OSError, ValueError, KeyError, TypeError):
            built_for = None  # (an extension built before the record existed: rebuild to see it)
    level = next((f for f in LEVELS if built_for and f in built_for), None)
    return {"extension": path, "variant": None if path is None else cpu_variants.chosen(),
            "variants_built": cpu_variants.built(), "variants_runnable": cpu_variants.runnable(),
            "in_use": fused_selected(), "built_for": built_for,
            "simd": level if built_for is None or level else "generic", "cpu": cpu_features()}


def cpu_features() -> list[str] | None:
    """This CPU's SIMD features among SIMD_FEATURES' (Linux: /proc/cpuinfo's flags); None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags = set(value.split())
                    return [name for name, _, flag in SIMD_FEATURES if flag in flags or name in flags]
    except OSError:
        return None
    return None
