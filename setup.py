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
"""

from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "slm.model._qkernels",
            sources=["slm/model/_qkernels.c"],
            depends=sorted(glob("slm/model/qkernels/*.[ch]")),
            extra_compile_args=["-O3", "-march=native", "-fopenmp", "-std=c11", "-ffp-contract=fast", "-fno-wrapv"],
            extra_link_args=["-fopenmp"],
            libraries=["m"],
            optional=True,
        )
    ]
)
