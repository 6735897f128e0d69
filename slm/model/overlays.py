"""Adapter overlays: contributions added around a linear layer at inference, never merged.

For a linear layer y = x W^T (x (T, in), W (out, in)):
    LoRA    y += weight * scale * (x A^T) B^T          A (r, in), B (out, r)
    IA3     y *= 1 + weight * (v - 1)   (output)       v (out,)
            x *= 1 + weight * (v - 1)   (input, for feed-forward modules)   v (in,)
    sparse  y += weight * scale * x D^T, D (out, in) with k stored entries

`input_scale(name)` is an IA3 input vector or None; `after(name, x, y)` adds to or scales the
output (slm.model.decoder.Decoder.linears composes them in load order). The base weights are never
touched, so removing an overlay restores the base bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slm.formats.llama import permute_hf_to_gguf, permute_gguf_to_hf


@dataclass(frozen=True)
class TargetData:
    module: str
    out_features: int
    in_features: int
    tensors: dict[str, np.ndarray]
    scale: float
    ia3_on: str | None = None


def _row_permutation(n_rows: int, n_heads: int, src: str, dst: str) -> np.ndarray:
    """perm such that rows_dst = rows_src[perm] when converting q/k rows between layouts."""
    idx = np.arange(n_rows)
    if src == dst:
        return idx
    return permute_hf_to_gguf(idx, n_heads) if dst == "gguf" else permute_gguf_to_hf(idx, n_heads)


class Overlay:
    """One adapter at one weight, ready for the forward pass."""

    def __init__(self, kind: str, weight: float):
        self.kind = kind
        self.weight = np.float32(weight)
        self.lora: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # name -> (A (r, in), (w*s*B)^T (r, out))
        self.scale_out: dict[str, np.ndarray] = {}
        self.scale_in: dict[str, np.ndarray] = {}
        self.sparse: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # rows, cols, vals

    def targets(self) -> set[str]:
        return set(self.lora) | set(self.scale_out) | set(self.scale_in) | set(self.sparse)

    def input_scale(self, name: str) -> np.ndarray | None:
        return self.scale_in.get(name)  # (in,) or None

    def low_rank(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(A (r, in), B^T (r, out)) if this overlay's only part at `name` is a plain LoRA."""
        if name in self.scale_out or name in self.scale_in or name in self.sparse:
            return None
        return self.lora.get(name)

    def after(self, name: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if name in self.lora:
            a, b_t = self.lora[name]
            y = y + (x @ a.T) @ b_t  # (T, in) @ (in, r) @ (r, out)
        if name in self.scale_out:
            y = y * self.scale_out[name]  # (T, out) * (out,)
        if name in self.sparse:
            rows, cols, vals = self.sparse[name]
            contrib = x[:, cols] * vals  # (T, k)
            y = y.copy()
            np.add.at(y.T, rows, contrib.T)  # y[:, rows[j]] += contrib[:, j]
        return y


def build_overlay(kind: str, weight: float, targets: list[TargetData], *, src_layout: str,
                  dst_layout: str, heads: dict[str, int]) -> Overlay:
    """heads: slm.arch.roles.qk_heads of the base (role -> head count), for re-ordering q/k output rows."""
    ov = Overlay(kind, weight)
    w = np.float32(weight)
    for t in targets:
        perm = None
        for suffix, n_heads in heads.items():
            if t.module.endswith(f".{suffix}.weight") and src_layout != dst_layout:
                perm = _row_permutation(t.out_features, n_heads, src_layout, dst_layout)
        if kind == "lora":
            a, b = t.tensors["A"], t.tensors["B"]  # (r, in), (out, r)
            if perm is not None:
                b = b[perm]
            ov.lora[t.module] = (
                np.ascontiguousarray(a, dtype=np.float32),
                np.ascontiguousarray((b * np.float32(t.scale) * w).T, dtype=np.float32),
            )
        elif kind == "ia3":
            v = t.tensors["vector"].astype(np.float32)
            v = np.float32(1) + w * (v - np.float32(1))
            if t.ia3_on == "input":
                ov.scale_in[t.module] = v
            else:
                ov.scale_out[t.module] = v if perm is None else v[perm]
        elif kind == "sparse":
            idx = t.tensors["indices"].astype(np.int64)
            rows, cols = np.divmod(idx, t.in_features)  # flat row-major -> (row, col)
            if perm is not None:
                rows = np.argsort(perm)[rows]  # old row r moves to position perm^-1[r]
            vals = t.tensors["values"].astype(np.float32) * np.float32(t.scale) * w
            ov.sparse[t.module] = (rows, cols, vals)
        else:
            raise ValueError(f"unknown adapter kind {kind!r}")
    return ov


def combined_low_rank(overlays: list[Overlay], name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The overlays' contributions at `name` as ONE low-rank pair (A (R, in), B^T (R, out)), for
    a kernel that adds (x A^T) B^T inside its own loop; None unless every one of them is a plain
    LoRA there (an IA3 scale or a sparse delta must apply in load order, after the sum so far).

    A sum of LoRAs is a LoRA of the summed rank: the A's and the B^T's stacked (a copy only
    when more than one adapter targets the layer)."""
    pairs = [o.low_rank(name) for o in overlays]
    if not pairs or any(p is None for p in pairs):
        return None
    if len(pairs) == 1:
        return pairs[0]
    a = np.concatenate([p[0] for p in pairs], axis=0)  # (R, in)
    b_t = np.concatenate([p[1] for p in pairs], axis=0)  # (R, out)
    return a, b_t
