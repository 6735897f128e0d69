"""Builds slm's C kernels; everything else is in pyproject.toml.

The kernels are one translation unit, slm/model/_qkernels.c (a unity build: it #includes the
kernel sources of slm/model/qkernels/, listed here as `depends` so that an edit to any of them
rebuilds the extensions and an sdist carries them), compiled once per CPU variant of
slm/model/cpu_variants.py into a module of its own, slm.model._qkernels_<variant>: on x86-64
the baseline, AVX2 (x86-64-v3) and AVX-512 (x86-64-v4 + VNNI) levels, whichever CPU builds
them, so that one build runs right on every x86-64 (slm loads the best one the CPU runs); on
another CPU one variant for the machine that builds it (-march=native). Each variant compiles
from its own one-line source in slm/model/variants/ (the same unit under another object name),
the variants in parallel. The kernels are parallelised with OpenMP. The extensions are optional:
without a C compiler (or one that refuses a variant's flags) slm installs anyway and runs the
variants that built, or the NumPy reference kernels (slower, same results within 1e-5).

-fno-wrapv undoes the -fwrapv that Python's own CFLAGS put on every extension (CPython's C
relies on signed overflow wrapping; these kernels do not): with it, GCC must keep the tiles'
int index arithmetic wrapping in 32 bits, which slows the batched decode step.

Beside each extension, _qkernels_<variant>.build.json records its flags and the SIMD macros the
compiler defines for them, which `slm --version` reports as the kernels' build
(slm.model.kernel_choice.build_info).
"""

import json
import os
import runpy
import subprocess
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMPILE_ARGS = ["-O3", "-fopenmp", "-std=c11", "-ffp-contract=fast", "-fno-wrapv"]
# (loaded by path: slm is not importable while it is being built)
VARIANTS = runpy.run_path(os.path.join("slm", "model", "cpu_variants.py"))["variants"]()
# what an edit rebuilds, and what an sdist carries: every variant's source too, whichever
# variants this machine builds (an sdist made on x86-64 builds `native` elsewhere)
DEPENDS = ["slm/model/_qkernels.c", *sorted(glob("slm/model/qkernels/*.[ch]")), *sorted(glob("slm/model/variants/*.c"))]


class BuildExtRecordingSimd(build_ext):
    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:  # the variants compile at once, a core each
            self.parallel = True

    def build_extension(self, ext):
        super().build_extension(ext)
        compiler = getattr(self.compiler, "compiler_so", None)
        if not compiler:
            return
        try:  # the macros of the very flags the extension was compiled with
            out = subprocess.run([*compiler[:1], *ext.extra_compile_args, "-dM", "-E", "-x", "c", os.devnull],
                                 capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return  # (the build stands; `slm --version` then says the level is unknown)
        macros = sorted(line.split()[1] for line in out.splitlines() if line.startswith("#define "))
        # beside the built file, and beside the package's source: an in-place build (make, an
        # editable install) builds under build/ and copies only the extension into the package
        package_dir = os.path.join(*ext.name.split(".")[:-1])
        for folder in {os.path.dirname(self.get_ext_fullpath(ext.name)), package_dir}:
            if os.path.isdir(folder):
                with open(os.path.join(folder, ext.name.split(".")[-1] + ".build.json"), "w") as f:
                    json.dump({"flags": ext.extra_compile_args, "macros": macros}, f)


setup(
    cmdclass={"build_ext": BuildExtRecordingSimd},
    ext_modules=[
        Extension(
            f"slm.model._qkernels_{name}",
            sources=[f"slm/model/variants/{name}.c"],
            depends=DEPENDS,
            define_macros=[("SLM_VARIANT", name)],
            extra_compile_args=[*COMPILE_ARGS, *flags],
            extra_link_args=["-fopenmp"],
            libraries=["m"],
            optional=True,
        )
        for name, flags, _ in VARIANTS
    ]
)
