"""slm: an immutable quantized base, adapters as reversible overlays."""

import os

__version__ = "0.1.0"

# slm parallelises matrix-vector work itself (numba prange over rows, on OpenMP). Two thread
# pools that spin while they wait turn a decode step on 2 busy cores into a 20-100x slowdown
# (measured, docs/benchmarks.md): OpenBLAS gets one thread, and OpenMP threads sleep instead
# of spinning. Defaults only; they take effect when slm is imported before NumPy, as the
# `slm` command does.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
