"""A decoder forward pass in NumPy over quantized weights (float32 activations), for every
family slm.arch describes (Llama, Gemma 3, Qwen2, Qwen3).

Reads like the math: rms_norm, rope, attention, mlp; the block and the logits head are
functions of the rows they run on (slm.model.block), a Decoder being one sequence's rows.
What differs between families
(norms after attention and MLP, q/k norms, biases, activation, embedding scale, sliding
windows, RoPE bases) comes from the family's description (Config.desc), never from its name.
Weights are QuantTensors named the GGUF way; every linear layer goes through `linears`, the one
place where a kernel multiplies and where adapter overlays add their contribution (never
merged into the base). A one-token step of a composition the C kernels take whole runs all
its layers in one native call instead (slm.model.step_native: the same functions, the same
bits); this module stays the definition that path is tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from slm import arch as archs
from slm.arch import Architecture
from slm.model import block, mathops
from slm.model.kernels import default_kernels
from slm.model.mathops import rope_tables
from slm.model.overlays import combined_low_rank
from slm.model.weights import QuantTensor



class Overlay(Protocol):
    """An adapter's contribution to linear layers (slm.model.overlays.Overlay): every method
    the executor calls on one."""

    def targets(self) -> set[str]: ...  # the weight names it modifies

    def input_scale(self, name: str) -> np.ndarray | None: ...  # (in,) scaling x first, or None

    def low_rank(self, name: str) -> tuple[np.ndarray, np.ndarray] | None: ...  # (A, B^T) if plain LoRA there

    def after(self, name: str, x: np.ndarray, y: np.ndarray) -> np.ndarray: ...  # y with its part applied


@dataclass(frozen=True)
class Config:
    desc: Architecture
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
    sliding_window: int
    layer_types: tuple[str, ...]
    rope_theta_local: float
    query_pre_attn_scalar: float
    final_logit_softcap: float
    qk_row_layout: str  # "gguf" (pairs 2i, 2i+1) or "hf" (halves i, i + d/2)

    @classmethod
    def from_architecture(cls, arch: dict, qk_row_layout: str) -> "Config":
        """From a base manifest's (checked) [architecture] table."""
        h = archs.hyperparameters(arch)
        fields = {k: h[k] for k in cls.__dataclass_fields__ if k in h and k != "family"}
        return cls(desc=archs.get(arch["family"]), **{**fields, "layer_types": tuple(h["layer_types"])},
                   qk_row_layout=qk_row_layout)

    def window(self, layer: int) -> int:
        """How many positions the layer's queries see (themselves included); 0 = all."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else 0

    def rope_base(self, layer: int) -> float:
        return self.rope_theta_local if self.layer_types[layer] == "sliding_attention" else self.rope_theta


class KVCache:
    """Keys and values of every layer, allocated once for up to `capacity` positions.

    A full-attention layer keeps every position. A sliding layer keeps only the last `window`
    (a ring: position p lives in slot p % window), so its memory is bounded by the window
    whatever the context."""

    def __init__(self, cfg: Config, capacity: int, dtype=np.float32):
        windows = [cfg.window(i) for i in range(cfg.num_layers)]
        slots = [min(capacity, w) if w else capacity for w in windows]
        self.k = [np.zeros((s, cfg.num_kv_heads, cfg.head_dim), dtype=dtype) for s in slots]  # (S_l, n_kv, hd)
        self.v = [np.zeros_like(k) for k in self.k]
        self.length = 0  # positions filled
        self.capacity = capacity
        self.native = None  # the arrays' addresses for the native decode step (slm.model.step_native)

    def extend(self, layer: int, start: int, k: np.ndarray, v: np.ndarray):
        """Store the keys/values k, v (T, n_kv, hd) of positions start..start+T-1 and return what
        those positions' queries attend to: (keys, values, first), keys[first + t] being the key
        of position start + t and the keys before it the earlier positions, in order."""
        T = k.shape[0]
        ks, vs = self.k[layer], self.v[layer]
        slots = ks.shape[0]
        if start + T <= slots:  # every layer until a ring wraps: slot = position
            ks[start:start + T], vs[start:start + T] = k, v
            return ks[:start + T], vs[:start + T], start
        if T == 1:  # the ring holds exactly the window; one query needs no order
            ks[start % slots], vs[start % slots] = k[0], v[0]
            return ks, vs, slots - 1
        # Several queries past a wrapped ring: the older positions of the first query's
        # window in order, then the new ones (attention masks by the window).
        old = np.arange(max(0, start - slots + 1), start) % slots
        keys, values = np.concatenate([ks[old], k]), np.concatenate([vs[old], v])
        keep = np.arange(start + T - min(T, slots), start + T)  # the newest positions
        ks[keep % slots], vs[keep % slots] = k[keep - start], v[keep - start]
        return keys, values, len(old)

    def state(self) -> dict[str, np.ndarray]:
        """The cached positions of every layer in position order, for saving (prefix cache)."""
        out = {}
        for layer, (ks, vs) in enumerate(zip(self.k, self.v)):
            kept = np.arange(max(0, self.length - ks.shape[0]), self.length) % ks.shape[0]
            out[f"k{layer}"], out[f"v{layer}"] = ks[kept], vs[kept]
        return out

    def restore(self, state: dict[str, np.ndarray], length: int) -> bool:
        """Fill an empty cache from `state` (a `state()` of the same model with `length`
        positions); False, the cache left empty, if it does not fit."""
        if length > self.capacity:
            return False
        for layer, ks in enumerate(self.k):
            shape = (min(length, ks.shape[0]), *ks.shape[1:])
            if any(getattr(state.get(f"{kv}{layer}"), "shape", None) != shape for kv in "kv"):
                return False
        for layer, (ks, vs) in enumerate(zip(self.k, self.v)):
            slots = np.arange(max(0, length - ks.shape[0]), length) % ks.shape[0]
            ks[slots], vs[slots] = state[f"k{layer}"], state[f"v{layer}"]
        self.length = length
        return True


class Decoder:
    def __init__(self, cfg: Config, tensors: dict[str, QuantTensor], kernels=None,
                 overlays: list[Overlay] | tuple = ()):
        self.cfg = cfg
        self.t = tensors
        self.kernels = kernels or default_kernels()
        self.overlays = overlays
        # Norm weights and biases are tiny: keep them as float32 vectors.
        self.vectors = {n: w.dequantize().reshape(-1) for n, w in tensors.items() if len(w.shape) == 1}
        self.bias = {n.removesuffix(".bias") + ".weight": b for n, b in self.vectors.items() if n.endswith(".bias")}
        self.embed_scale = np.float32(math.sqrt(cfg.hidden_size)) if cfg.desc.embedding_scale else None
        # kernels.attend scales scores by head_dim^-1/2; a model asking for another scale gets
        # its queries multiplied by the ratio (1.0 for all but Gemma 3 27B-like configurations)
        ratio = math.sqrt(cfg.head_dim / cfg.query_pre_attn_scalar)
        self.q_scale = None if ratio == 1.0 else np.float32(ratio)
        self.rope_bases = [cfg.rope_base(i) for i in range(cfg.num_layers)]

    @property
    def overlays(self) -> list[Overlay]:
        return self._overlays

    @overlays.setter
    def overlays(self, overlays) -> None:
        self._overlays = list(overlays)
        self._plans: dict[tuple, tuple] = {}  # (name, fuses) -> (low-rank term, overlays after)
        self._native: tuple | None = None  # (kernels, its NativeStep or None): see native_step

    def native_step(self):
        """The decode step in one native call for this model with these kernels and overlays
        (slm.model.step_native.NativeStep), or None when a part of it needs the op-by-op path."""
        cached = self._native
        if cached is None or cached[0] is not self.kernels:
            from slm.model.step_native import NativeStep

            cached = self._native = (self.kernels, NativeStep.for_model(self))
        return cached[1]

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        """y = x W'^T (+ b) where W' is the base weight with every overlay applied in load order."""
        return self.linears(x, [name])[0]

    def linears(self, x: np.ndarray, names: list[str]) -> list[np.ndarray]:
        """[linear(x, n) for n in names]: the base products in one kernel call (the fused
        kernels then wake their threads once, and add plain-LoRA overlays inside their own
        loop), unless an overlay scales one of these layers' input. A bias belongs to the base
        layer: it is added before any overlay that scales the output (as PEFT's IA3 scales
        base_layer(x), bias included)."""
        if any(o.input_scale(n) is not None for o in self.overlays for n in names):
            return [self._linear_in_load_order(x, n) for n in names]
        plans = [self.overlay_plan(n) for n in names]
        if any(term is not None for term, _ in plans):
            ys = self.kernels.matmul_many(x, [self.t[n] for n in names], [term for term, _ in plans])
        else:
            ys = self.kernels.matmul_many(x, [self.t[n] for n in names])  # [(T, out_n)]
        for i, (name, (_, after)) in enumerate(zip(names, plans)):
            if name in self.bias:
                ys[i] += self.bias[name]  # (T, out) + (out,)
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
        if name in self.bias:
            y += self.bias[name]
        for overlay, seen in zip(self.overlays, inputs):
            y = overlay.after(name, seen, y)
        return y

    def overlay_plan(self, name: str) -> tuple:
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
        logits_for == "all", else (1, V) for the last position (the same bits as the last row
        of "all"). Safe to call from several
        threads with caches of their own: the passes take turns on the kernel set (its lock)."""
        with self.kernels.lock:
            return self._forward(tokens, cache, logits_for)

    def _forward(self, tokens: np.ndarray, cache: KVCache, logits_for: str) -> np.ndarray:
        cfg = self.cfg
        T = len(tokens)
        start = cache.length
        if start + T > cache.capacity:
            raise ValueError(f"KV cache holds {cache.capacity} positions; {start + T} needed")
        x = self.kernels.embed(np.asarray(tokens), self.t["token_embd.weight"])  # (T, H)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        step = self.native_step() if T == 1 else None
        if step is not None and step.takes(cache):  # every layer in one native call, same arithmetic
            x = step.run([(step, cache)], x)  # (1, H), after the output norm (its own RoPE tables)
            cache.length = start + 1
            return block.logits(self, x)
        positions = np.arange(start, start + T)
        tables = {base: rope_tables(cfg.head_dim, base, positions) for base in set(self.rope_bases)}  # (cos, sin)
        for layer in range(cfg.num_layers):
            x = block.block(self, layer, x, cache, start, *tables[self.rope_bases[layer]])
        cache.length = start + T
        if logits_for != "all":
            x = x[-1:]
        x = self.kernels.rms_norm(x, self.vectors["output_norm.weight"], cfg.rms_norm_eps)
        y = block.logits(self, x)
        if T > 1 and logits_for == "all":
            # The last row again, alone, as a "last" pass computes it: a product over many rows
            # may take another kernel (BLAS, in another summation order) than over one row, and
            # the last row is the one a generation samples from, so it is the same bits whether
            # or not the caller keeps every row (slm run --logits-out, Session.logits).
            y[-1] = block.logits(self, x[-1:])[0]
        return y

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, first: int, window: int = 0) -> np.ndarray:
        """Causal attention of q (T, nh, hd) at positions first.. over k, v (S, n_kv, hd),
        S = first + T; with a window, query t sees only the `window` keys ending at first + t.

        Kernels that attend causally (the C kernels: attend_causal) take a prompt whole, on
        their own threads. Otherwise a long batch is split into two query ranges of about
        equal work, run by the kernels' two threads (NumPy releases the GIL); each range only
        needs the keys from its first query's window start to its last position."""
        T = q.shape[0]
        if T > 1 and self.kernels.attends_causally():
            return self.kernels.attend_causal(q, k, v, first, window)

        def attend(a: int, b: int) -> np.ndarray:
            lo = max(0, first + a - window + 1) if window else 0
            qs, ks, vs, at = q[a:b], k[lo:first + b], v[lo:first + b], first + a - lo
            if window and b - a > 1 and at + b - a > window:
                # (the kernel sets' attend has no band: their fast path is a single query)
                return mathops.attend(qs, ks, vs, at, window)
            return self.kernels.attend(qs, ks, vs, at)

        if T < 64:
            return attend(0, T)
        banded = window and first + T > window
        split = T // 2 if first or banded else int(T / np.sqrt(2))  # equal areas of the triangle
        return np.concatenate(self.kernels.map_parallel(lambda r: attend(*r), [(0, split), (split, T)]))
