"""The C kernels' CPU variants, and the one loader of them.

One build holds the same kernel sources (slm/model/_qkernels.c, a unity build) compiled once per
x86-64 level, each into an extension module of its own, slm.model._qkernels_<variant>: a copy
of the build runs on any x86-64 CPU. At start-up slm loads the best variant this CPU runs, or
the one SLM_CPU names (refused, exit 4, when the CPU cannot run it or it is not built). A CPU
other than x86-64 has one variant, compiled for the machine that builds it.

Which features the CPU has is asked of the CPU itself (cpuid, through the baseline module's
cpu_supports, which every x86-64 runs): /proc/cpuinfo describes the host, not the CPU an
emulator presents, and says nothing of whether the OS saves the wider registers.

setup.py reads variants() from this file by path, before slm is installed: it imports nothing
beyond the standard library at the top.
"""

from __future__ import annotations

import functools
import os
import platform

# Per variant, best first: its name (SLM_CPU's value), the compiler flags that select its
# instruction set, and what the CPU must support to run it, in GCC's __builtin_cpu_supports
# names (x86-64-v3: AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE; x86-64-v4: AVX-512 F/BW/CD/DQ/VL).
X86_64_VARIANTS = (
    ("avx512", ("-march=x86-64-v4", "-mavx512vnni", "-mtune=generic"), ("x86-64-v4", "avx512vnni")),
    ("avx2", ("-march=x86-64-v3", "-mtune=generic"), ("x86-64-v3",)),
    ("baseline", ("-march=x86-64", "-mtune=generic"), ()),
)
OTHER_VARIANTS = (("native", ("-march=native",), ()),)
MODULE_PREFIX = "slm.model._qkernels_"
ENV = "SLM_CPU"


def variants(machine: str | None = None) -> tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]:
    """The variants a build for `machine` (platform.machine()'s spelling; this one by default) holds."""
    machine = (machine or platform.machine()).lower()
    return X86_64_VARIANTS if machine in ("x86_64", "amd64") else OTHER_VARIANTS


@functools.cache
def _origin(name: str) -> str | None:
    import importlib.util

    spec = importlib.util.find_spec(MODULE_PREFIX + name)
    return spec.origin if spec is not None and spec.origin else None


def built() -> list[str]:
    """The variants whose extension module is installed, best first."""
    return [name for name, _, _ in variants() if _origin(name) is not None]


@functools.cache
def cpu_supports() -> frozenset[str]:
    """The features among the variants' requirements that this CPU (and its OS) supports, asked
    of the baseline module; none when that is not built (then only an unconditioned variant runs)."""
    needed = {feature for _, _, requires in variants() for feature in requires}
    if not needed or _origin("baseline") is None:
        return frozenset()
    import importlib

    probe = importlib.import_module(MODULE_PREFIX + "baseline").cpu_supports
    return frozenset(feature for feature in needed if probe(feature))


def runnable() -> list[str]:
    """The built variants this CPU can run, best first."""
    requires = {name: set(needs) for name, _, needs in variants()}
    return [name for name in built() if requires[name] <= cpu_supports()]


def chosen() -> str | None:
    """The variant to load: SLM_CPU's, else the best runnable one; None when none is built.
    SLM_CPU naming an unknown variant, one not built or one this CPU cannot run is InvalidInput."""
    wanted = os.environ.get(ENV, "")
    if not wanted:
        best = runnable()
        return best[0] if best else None
    names = [name for name, _, _ in variants()]
    if wanted not in names:
        problem = f"not one of {', '.join(names)}"
    elif wanted not in built():
        problem = f"that variant was not built (the compiler refused its flags); built: {', '.join(built()) or 'none'}"
    elif wanted not in runnable():
        problem = f"this CPU cannot run that variant; it runs {', '.join(runnable()) or 'none'}"
    else:
        return wanted
    from slm.errors import InvalidInput

    raise InvalidInput(f"{ENV}={wanted!r}: {problem}")


def library_path() -> str | None:
    """The file of the variant to load (chosen()), or None when no variant is built."""
    name = chosen()
    return None if name is None else _origin(name)


def module():
    """The extension module of the variant to load, imported; None when no variant is built."""
    import importlib

    name = chosen()
    return None if name is None else importlib.import_module(MODULE_PREFIX + name)
