"""The seam between the model and the codecs: `matmul(x, weight)`.

The reference path dequantizes a bounded chunk of rows into a scratch buffer allocated once,
then multiplies with BLAS. A fused dequantize-multiply kernel can replace it behind the same
interface; the two are differential-tested.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack, contextmanager

import numpy as np

from slm.model import mathops
from slm.model.kernel_choice import fused_selected
from slm.model.weights import QuantTensor

DEFAULT_SCRATCH_ELEMS = 1 << 20  # 4 MiB of float32: bounds the dequantized working set


class KernelArgumentError(ValueError):
    """Operands a kernel cannot take (an input whose width is not the weight's). Shapes are
    checked against the architecture at import and activation, so no input reaches this: it is
    a bug in the caller (exit 1, INTERNAL). A real check, not an assert, because the C kernels
    would read past the end of x under `python -O`."""


def check_width(x: np.ndarray, cols: int, name: str) -> None:
    """x (T, in) must have in == cols, the weight's input width."""
    if x.ndim != 2 or x.shape[1] != cols:
        raise KernelArgumentError(f"{name}: input of shape {x.shape} for a weight of {cols} columns")


class Kernels:
    """What the model asks of a kernel set. matmul and embed are each set's own; the batched
    forms default to a loop, which a parallel set replaces."""

    name = "abstract"
    fuses_low_rank = False  # whether matmul_many also takes LoRA terms to add (slm.model.decoder)

    def __init__(self):
        # A kernel set keeps state between calls (scratch buffers, the C job descriptors whose
        # output pointers each call rewrites, the prefill thread): one forward pass at a time
        # may use it. Reentrant: a batch step that holds it may run a row's forward pass.
        self.lock = threading.RLock()

    def matmul(self, x: np.ndarray, w: QuantTensor) -> np.ndarray:
        raise NotImplementedError

    def matmul_many(self, x: np.ndarray, weights: list[QuantTensor]) -> list[np.ndarray]:
        """[x @ w.T for w in weights]: one input, several weights (q, k, v; gate, up)."""
        return [self.matmul(x, w) for w in weights]

    def map_parallel(self, fn, items: list) -> list:
        """[fn(i) for i in items]; the fused kernels run these on their two threads."""
        return [fn(i) for i in items]

    def attends_causally(self) -> bool:
        """Whether attend_causal takes a whole prompt's attention (on the set's own threads)."""
        return False

    def set_threads(self, n: int) -> None:
        """Use at most n threads (the NumPy reference path uses one anyway)."""

    # The rest of a block (slm.model.mathops defines them; a kernel set may do them faster).
    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        return mathops.rms_norm(x, weight, eps)

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, layout: str) -> np.ndarray:
        return mathops.rope(x, cos, sin, layout)

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, first: int) -> np.ndarray:
        return mathops.attend(q, k, v, first)

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return mathops.swiglu(gate, up)

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return mathops.geglu(gate, up)


class ReferenceKernels(Kernels):
    name = "numpy-reference"

    def __init__(self, scratch_elems: int = DEFAULT_SCRATCH_ELEMS):
        super().__init__()
        self.scratch = np.empty(scratch_elems, dtype=np.float32)

    def set_activations(self, mode: str) -> None:
        """Products in float32 (the int8 mode, the default where slm's C kernels are built,
        needs them: without them the exact mode is the default)."""
        if mode != "float32":
            raise KernelArgumentError(f"activations {mode!r} need slm's C kernels (these are {self.name})")

    def matmul(self, x: np.ndarray, w: QuantTensor) -> np.ndarray:
        """x (T, in) float32 @ w.T -> (T, out) float32, w dequantized chunk by chunk."""
        check_width(x, w.cols, w.name)
        tokens, cols = x.shape
        out = np.empty((tokens, w.rows), dtype=np.float32)
        step = max(1, min(w.rows, self.scratch.size // cols))
        for start in range(0, w.rows, step):
            stop = min(w.rows, start + step)
            buf = self.scratch[: (stop - start) * cols].reshape(stop - start, cols)
            w.dequantize_rows(start, stop, out=buf)  # (rows_chunk, in)
            np.matmul(x, buf.T, out=out[:, start:stop])  # (T, rows_chunk)
        return out

    def embed(self, ids: np.ndarray, table: QuantTensor) -> np.ndarray:
        return table.take_rows(ids)  # (T, hidden)


@contextmanager
def holding(kernel_sets):
    """Hold the lock of every distinct kernel set given, taken in one global order (by id) so
    that two callers holding several never wait on each other in a cycle."""
    with ExitStack() as stack:
        for kernels in sorted({id(k): k for k in kernel_sets}.values(), key=id):
            stack.enter_context(kernels.lock)
        yield


def default_kernels():
    """The fused C kernels when they were built at install, else the reference path.

    SLM_KERNELS=reference forces the reference path (to compare, or to rule the kernels out).
    """
    if not fused_selected():
        return ReferenceKernels()
    from slm.model.kernels_native import NativeKernels

    return NativeKernels()
