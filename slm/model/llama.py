"""A Llama-family forward pass in NumPy over quantized weights (float32 activations).

Reads like the math: rms_norm, rope, attention, mlp, block. Weights are QuantTensors named
the GGUF way; every linear layer goes through `linear`, the one place where a kernel
multiplies and where adapter overlays add their contribution (never merged into the base).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from slm.model.kernels import default_kernels
from slm.model.mathops import rope_tables
from slm.model.overlays import combined_low_rank
from slm.model.weights import QuantTensor


class Overlay(Protocol):
    """An adapter's contribution to linear layers (see slm.model.overlays)."""

    def input_scale(self, name: str) -> np.ndarray | None: ...

    def after(self, name: str, x: np.ndarray, y: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context_length: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qk_row_layout: str  # "gguf" (pairs 2i, 2i+1) or "hf" (halves i, i + d/2)

    @classmethod
    def from_architecture(cls, arch: dict, qk_row_layout: str) -> "Config":
        fields = {k: arch[k] for k in cls.__dataclass_fields__ if k != "qk_row_layout"}
        return cls(**fields, qk_row_layout=qk_row_layout)


class KVCache:
    """Keys and values of every layer for up to `capacity` positions, allocated once."""

    def __init__(self, cfg: Config, capacity: int, dtype=np.float32):
        shape = (cfg.num_layers, capacity, cfg.num_kv_heads, cfg.head_dim)
        self.k = np.zeros(shape, dtype=dtype)  # (L, S, n_kv, hd)
        self.v = np.zeros(shape, dtype=dtype)
        self.length = 0  # positions filled
        self.capacity = capacity


class Llama:
    def __init__(self, cfg: Config, tensors: dict[str, QuantTensor], kernels=None,
                 overlays: list[Overlay] | tuple = ()):
        self.cfg = cfg
        self.t = tensors
        self.kernels = kernels or default_kernels()
        self.overlays = overlays
        # Norm weights are tiny: keep them as float32 vectors.
        self.norms = {n: w.dequantize().reshape(-1) for n, w in tensors.items() if len(w.shape) == 1}

    @property
    def overlays(self) -> list[Overlay]:
        return self._overlays

    @overlays.setter
    def overlays(self, overlays) -> None:
        self._overlays = list(overlays)
        self._plans: dict[tuple, tuple] = {}  # (name, fuses) -> (low-rank term, overlays after)

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        """y = x W'^T where W' is the base weight with every overlay applied in load order."""
        return self.linears(x, [name])[0]

    def linears(self, x: np.ndarray, names: list[str]) -> list[np.ndarray]:
        """[linear(x, n) for n in names]: the base products in one kernel call (the fused
        kernels then wake their threads once, and add plain-LoRA overlays inside their own
        loop), unless an overlay scales one of these layers' input."""
        if any(o.input_scale(n) is not None for o in self.overlays for n in names):
            return [self._linear_in_load_order(x, n) for n in names]
        plans = [self._plan(n) for n in names]
        if any(term is not None for term, _ in plans):
            ys = self.kernels.matmul_many(x, [self.t[n] for n in names], [term for term, _ in plans])
        else:
            ys = self.kernels.matmul_many(x, [self.t[n] for n in names])  # [(T, out_n)]
        for i, (name, (_, after)) in enumerate(zip(names, plans)):
            for overlay in after:
                ys[i] = overlay.after(name, x, ys[i])
        return ys

    def _linear_in_load_order(self, x: np.ndarray, name: str) -> np.ndarray:
        """The general case. An additive overlay (LoRA, sparse) adds its delta; an IA3 output
        vector scales all that came before it; an IA3 input vector scales the input of the
        base and of every earlier overlay, so overlay i sees x scaled by the input vectors
        that come after it."""
        inputs = [x] * len(self.overlays)
        for i in reversed(range(len(self.overlays))):
            inputs[i] = x
            scale = self.overlays[i].input_scale(name)
            if scale is not None:
                x = x * scale  # (T, in) * (in,)
        y = self.kernels.matmul(x, self.t[name])  # (T, out)
        for overlay, seen in zip(self.overlays, inputs):
            y = overlay.after(name, seen, y)
        return y

    def _plan(self, name: str) -> tuple:
        """(low-rank term the kernel adds, or None; overlays to apply after it, in load order)."""
        fuses = self.kernels.fuses_low_rank  # the kernels can be swapped (tests, bench)
        plan = self._plans.get((name, fuses))
        if plan is None:
            touching = [o for o in self.overlays if name in o.targets()]
            term = combined_low_rank(touching, name) if fuses else None
            plan = self._plans[(name, fuses)] = (term, [] if term is not None else touching)
        return plan

    def new_cache(self, capacity: int, dtype=np.float32) -> KVCache:
        return KVCache(self.cfg, capacity, dtype)

    def forward(self, tokens: np.ndarray, cache: KVCache, logits_for: str = "last") -> np.ndarray:
        """Run tokens (T,) at positions cache.length.. ; returns logits (T, V) if
        logits_for == "all", else (1, V) for the last position."""
        cfg = self.cfg
        T = len(tokens)
        start = cache.length
        if start + T > cache.capacity:
            raise ValueError(f"KV cache holds {cache.capacity} positions; {start + T} needed")
        positions = np.arange(start, start + T)
        cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, positions)
        x = self.kernels.embed(np.asarray(tokens), self.t["token_embd.weight"])  # (T, H)
        for layer in range(cfg.num_layers):
            x = self.block(layer, x, cache, start, cos, sin)
        cache.length = start + T
        if logits_for != "all":
            x = x[-1:]
        x = self.kernels.rms_norm(x, self.norms["output_norm.weight"], cfg.rms_norm_eps)
        return self.logits(x)

    def logits(self, x: np.ndarray) -> np.ndarray:
        if "output.weight" in self.t:
            return self.linear(x, "output.weight")  # (T, V)
        # Tied head: the embedding table doubles as the output projection.
        return self.kernels.matmul(x, self.t["token_embd.weight"])

    def block(self, layer: int, x: np.ndarray, cache: KVCache, start: int,
              cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        p = f"blk.{layer}."
        T = x.shape[0]
        kern = self.kernels
        h = kern.rms_norm(x, self.norms[p + "attn_norm.weight"], cfg.rms_norm_eps)
        q, k, v = self.linears(h, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
        q = q.reshape(T, cfg.num_heads, cfg.head_dim)
        k = k.reshape(T, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(T, cfg.num_kv_heads, cfg.head_dim)
        q = kern.rope(q, cos, sin, cfg.qk_row_layout)
        k = kern.rope(k, cos, sin, cfg.qk_row_layout)
        cache.k[layer, start:start + T] = k
        cache.v[layer, start:start + T] = v
        attn = self.attention(q, cache.k[layer, :start + T], cache.v[layer, :start + T], start)
        x = x + self.linear(attn, p + "attn_output.weight")
        h = kern.rms_norm(x, self.norms[p + "ffn_norm.weight"], cfg.rms_norm_eps)
        gate, up = self.linears(h, [p + "ffn_gate.weight", p + "ffn_up.weight"])  # (T, F) each
        return x + self.linear(kern.swiglu(gate, up), p + "ffn_down.weight")

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
        """Causal attention of q (T, nh, hd) over k, v (S, n_kv, hd), S = start + T.

        A long batch is split into two query ranges of about equal causal work, run by the
        kernels' two threads (NumPy releases the GIL); each range only needs the keys up to
        its last position."""
        T = q.shape[0]
        if T < 64:
            return self.kernels.attend(q, k, v, start)
        split = int(T / np.sqrt(2)) if start == 0 else T // 2  # equal areas of the triangle
        ranges = [(0, split), (split, T)]
        outs = self.kernels.map_parallel(
            lambda r: self.kernels.attend(q[r[0]:r[1]], k[:start + r[1]], v[:start + r[1]], start + r[0]), ranges)
        return np.concatenate(outs)  # (T, nh*hd)
