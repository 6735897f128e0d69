"""The fresh-base oracle: the composition's math done the other way round.

Where the executor keeps the base quantized and adds overlays around each layer in float32,
the oracle builds every weight densely in float64 straight from the stored bytes:

    W' = dequant(W_q) + sum_i w_i * dW_i          (float64, no intermediate quantization)
    LoRA  dW = scale * B @ A          IA3  W' = diag(1 + w (v - 1)) W  (or W diag(...) for inputs)
    sparse dW[r, c] += scale * value

in the adapter's own row layout, then permutes the whole delta into the base's q/k row layout.
It shares no overlay code with the executor, so a wrong scale, sign or row order shows.
"""

from __future__ import annotations

import numpy as np

from slm.formats.llama import permute_gguf_to_hf, permute_hf_to_gguf
from slm.model.kernels import Kernels
from slm.model.overlays import TargetData
from slm.model.weights import QuantTensor


class OracleAdapter:
    def __init__(self, kind: str, weight: float, targets: list[TargetData], src_layout: str):
        self.kind, self.weight, self.src_layout = kind, float(weight), src_layout
        self.targets = {t.module: t for t in targets}


class OracleKernels(Kernels):
    """matmul(x, w) = x @ W'^T in float64, W' merged afresh from the stored bytes on every call."""

    name = "float64-fresh-base-oracle"

    def __init__(self, adapters: list[OracleAdapter], dst_layout: str, heads: dict[str, int]):
        self.adapters, self.dst_layout, self.heads = adapters, dst_layout, heads

    def _to_base_rows(self, module: str, rows: np.ndarray, src: str) -> np.ndarray:
        for suffix, n_heads in self.heads.items():
            if module.endswith(f".{suffix}.weight") and src != self.dst_layout:
                return permute_hf_to_gguf(rows, n_heads) if self.dst_layout == "gguf" else \
                    permute_gguf_to_hf(rows, n_heads)
        return rows

    def weight(self, w: QuantTensor) -> np.ndarray:
        W = w.dequantize().astype(np.float64)  # (out, in)
        for a in self.adapters:
            t = a.targets.get(w.name)
            if t is None:
                continue
            if a.kind == "lora":
                delta = t.scale * (t.tensors["B"].astype(np.float64) @ t.tensors["A"].astype(np.float64))
                W = W + a.weight * self._to_base_rows(w.name, delta, a.src_layout)
            elif a.kind == "ia3":
                v = 1.0 + a.weight * (t.tensors["vector"].astype(np.float64) - 1.0)
                if t.ia3_on == "input":
                    W = W * v[None, :]
                else:
                    W = W * self._to_base_rows(w.name, v, a.src_layout)[:, None]
            else:
                delta = np.zeros(W.shape)
                rows, cols = np.divmod(t.tensors["indices"].astype(np.int64), W.shape[1])
                np.add.at(delta, (rows, cols), t.scale * t.tensors["values"].astype(np.float64))
                W = W + a.weight * self._to_base_rows(w.name, delta, a.src_layout)
        return W

    def matmul(self, x: np.ndarray, w: QuantTensor) -> np.ndarray:
        return x.astype(np.float64) @ self.weight(w).T  # (T, out)

    def embed(self, ids: np.ndarray, table: QuantTensor) -> np.ndarray:
        return table.take_rows(ids).astype(np.float64)
