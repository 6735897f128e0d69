"""Builds slm's one C extension; everything else is in pyproject.toml.

The kernels are compiled for the machine that installs them (-march=native, like llama.cpp)
and parallelised with OpenMP. The extension is optional: without a C compiler slm installs
anyway and runs the NumPy reference kernels (slower, same results within 1e-5).

-fno-wrapv undoes the -fwrapv that Python's own CFLAGS put on every extension (CPython's C
relies on signed overflow wrapping; these kernels do not): with it, GCC must keep the tiles'
int index arithmetic wrapping in 32 bits, which slows the batched decode step.

slm/model/_qkernels.c is the one translation unit (a unity build): it #includes the kernel
sources of slm/model/qkernels/, listed here as `depends` so that an edit to any of them
rebuilds the extension and an sdist carries them.

Beside the extension, _qkernels.build.json records the SIMD macros the compiler defines for
these flags (-march=native: the installing CPU's), which `slm --version` reports as the
kernels' build (slm.model.kernel_choice.build_info).
"""

import json
import os
import subprocess
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMPILE_ARGS = ["-O3", "-march=native", "-fopenmp", "-std=c11", "-ffp-contract=fast", "-fno-wrapv"]


class BuildExtRecordingSimd(build_ext):
    def build_extension(self, ext):
        super().build_extension(ext)
        compiler = getattr(self.compiler, "compiler_so", None)
        if not compiler:
            return
        try:  # the macros of the very flags the extension was compiled with
            out = subprocess.run([*compiler[:1], *COMPILE_ARGS, "-dM", "-E", "-x", "c", os.devnull],
                                 capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return  # (the build stands; `slm --version` then says the level is unknown)
        macros = sorted(line.split()[1] for line in out.splitlines() if line.startswith("#define "))
        record = os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), "_qkernels.build.json")
        with open(record, "w") as f:
            json.dump({"flags": COMPILE_ARGS, "macros": macros}, f)


setup(
    cmdclass={"build_ext": BuildExtRecordingSimd},
    ext_modules=[
        Extension(
            "slm.model._qkernels",
            sources=["slm/model/_qkernels.c"],
            depends=sorted(glob("slm/model/qkernels/*.[ch]")),
            extra_compile_args=COMPILE_ARGS,
            extra_link_args=["-fopenmp"],
            libraries=["m"],
            optional=True,
        )
    ]
)
