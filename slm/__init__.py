"""slm: an immutable quantized base, adapters as reversible overlays."""

import os

__version__ = "0.1.0"

# slm parallelises matrix-vector work itself (numba prange over rows). OpenBLAS's own thread
# pool, spinning beside it, made a decode step up to 100x slower on a 2-core machine (measured:
# docs/benchmarks.md). One BLAS thread unless the user says otherwise; this only takes effect
# when slm is imported before NumPy, as the `slm` command does.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
