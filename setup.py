"""Builds slm's one C extension; everything else is in pyproject.toml.

The kernels are compiled for the machine that installs them (-march=native, like llama.cpp)
and parallelised with OpenMP. The extension is optional: without a C compiler slm installs
anyway and runs the NumPy reference kernels (slower, same results within 1e-5).

-fno-wrapv undoes the -fwrapv that Python's own CFLAGS put on every extension (CPython's C
relies on signed overflow wrapping; these kernels do not): with it, GCC 12 must keep the
tiles' int index arithmetic wrapping in 32 bits, and an 8-row decode step ran 3-5% slower
(in-process A/B on SmolLM2, the same bits).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "slm.model._qkernels",
            sources=["slm/model/_qkernels.c"],
            extra_compile_args=["-O3", "-march=native", "-fopenmp", "-std=c11", "-ffp-contract=fast", "-fno-wrapv"],
            extra_link_args=["-fopenmp"],
            libraries=["m"],
            optional=True,
        )
    ]
)
