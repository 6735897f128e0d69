"""slm: an immutable quantized base, adapters as reversible overlays."""

import os

__version__ = "0.1.0"

# slm parallelises its matrix-vector work itself (C kernels on OpenMP threads, and two
# threads for a prompt's BLAS work). A multi-threaded OpenBLAS pool spinning beside them made
# a decode step on 2 busy cores 20-100x slower (measured, docs/benchmarks.md): OpenBLAS gets
# one thread per caller. A default only; it takes effect when slm is imported before NumPy,
# as the `slm` command does.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
