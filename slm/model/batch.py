"""One decode step for a batch of sequences on one base (the server's continuous batching).

Each row is a sequence of its own: its own composition (a Decoder over the shared base
tensors, with that composition's overlays), its own KV cache, its own position. The step
computes the base product of every linear layer for all rows at once with the fused kernel
that unpacks each quantized block once for all of them (NativeKernels.matmul_rows), each row
adding its own composition's LoRA terms inside the same kernel call; every other part of the
block runs per row, or on several rows with a kernel whose rows are independent.

The rule that makes a batched answer identical to the same request run alone (greedy): every
row goes through exactly the arithmetic the single-sequence forward pass (Decoder.forward with
one token) gives it. So the step runs the same slm.model.block functions a Decoder runs, over
BatchRows, a second implementation of their Rows interface that answers row-wise; anything that is not provably
row-independent (a weight type the fused kernel lacks, an IA3 input scale, overlays applied
after the kernel, NumPy math) is computed one row at a time with the row's own model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slm.model import block
from slm.model.block import ACTIVATION_KERNELS
from slm.model.decoder import Config, Decoder, KVCache
from slm.model.kernels import KernelArgumentError, holding
from slm.model.mathops import rope_tables
from slm.model.weights import QuantTensor


@dataclass
class Row:
    model: Decoder  # the row's composition: the shared base tensors and its own overlays
    cache: KVCache  # the row's keys and values (positions 0 .. cache.length - 1)
    token: int  # the token to run at position cache.length


def decode_step(rows: list[Row], kernels) -> np.ndarray:
    """Run each row's token at its next position; returns the logits (B, V), row i's being bit
    for bit rows[i].model.forward([rows[i].token], rows[i].cache, "last")[0]. Every row's model
    must be over the same base tensors; each cache gains one position.

    The rows whose composition the native step takes (slm.model.step_native: every layer in
    one C call) run together that way; the others run op by op, together. The step holds the
    lock of `kernels` and of every row's kernel set (their scratch state), so a thread running
    one of these models alone waits for it."""
    with holding([kernels, *(r.model.kernels for r in rows)]):
        return _decode_step(rows, kernels)


def _decode_step(rows: list[Row], kernels) -> np.ndarray:
    from slm.model.kernels_native import NativeKernels

    if not isinstance(kernels, NativeKernels) or len(rows) == 1:
        return np.concatenate([r.model.forward(np.asarray([r.token]), r.cache, "last") for r in rows])
    first = rows[0].model
    if any(r.model.t is not first.t for r in rows):
        raise KernelArgumentError("a batch step runs rows of one base")
    for r in rows:
        if r.cache.length + 1 > r.cache.capacity:
            raise ValueError(f"KV cache holds {r.cache.capacity} positions; {r.cache.length + 1} needed")
    steps = [r.model.native_step() for r in rows]
    native = [i for i, (s, r) in enumerate(zip(steps, rows)) if s is not None and s.takes(r.cache)]
    if not native:
        return _op_by_op(rows, kernels)
    x = _embed([rows[i] for i in native])
    # every layer of these rows in one native call, each row with its own terms and cache
    x = steps[native[0]].run([(steps[i], rows[i].cache) for i in native], x, kernels.int8)  # (B', H), after the output norm
    for i in native:
        rows[i].cache.length += 1
    logits = block.logits(BatchRows([rows[i] for i in native], kernels), x)  # (B', V)
    if len(native) == len(rows):
        return logits
    rest = [i for i in range(len(rows)) if i not in native]
    out = np.empty((len(rows), logits.shape[1]), dtype=logits.dtype)
    out[native], out[rest] = logits, _op_by_op([rows[i] for i in rest], kernels)
    return out


def _embed(rows: list[Row]) -> np.ndarray:
    """The rows' tokens embedded (B, H), as Decoder.forward embeds one (a table's rows are
    decoded each alone, so one call for all is each row's own)."""
    first = rows[0].model
    x = first.kernels.embed(np.asarray([r.token for r in rows]), first.t["token_embd.weight"])  # (B, H)
    return x if first.embed_scale is None else x * first.embed_scale


def _op_by_op(rows: list[Row], kernels) -> np.ndarray:
    """The block and the head (slm.model.block) over the batch's rows: each op on every row."""
    first = rows[0].model
    batch = BatchRows(rows, kernels)
    cfg = first.cfg
    starts = [r.cache.length for r in rows]
    x = _embed(rows)
    tables = {}
    for base in set(first.rope_bases):  # per row, as the single forward pass computes them
        pairs = [rope_tables(cfg.head_dim, base, np.arange(s, s + 1)) for s in starts]
        tables[base] = (np.concatenate([c for c, _ in pairs]), np.concatenate([s for _, s in pairs]))  # (B, hd/2)
    cache = BatchCache(rows, starts)
    for layer in range(cfg.num_layers):
        x = block.block(batch, layer, x, cache, None, *tables[first.rope_bases[layer]])
    for r in rows:
        r.cache.length += 1
    x = batch.kernels.rms_norm(x, first.vectors["output_norm.weight"], cfg.rms_norm_eps)
    return block.logits(batch, x)


class BatchCache:
    """The BlockCache of a batch: every row's own KVCache; extend returns per-row lists."""

    def __init__(self, rows: list[Row], starts: list[int]):
        self.rows, self.starts = rows, starts

    def extend(self, layer: int, _start, k: np.ndarray, v: np.ndarray):
        """k, v (B, n_kv, hd) -> ([keys_i], [values_i], [first_i]), one row each."""
        out = [r.cache.extend(layer, s, k[i:i + 1], v[i:i + 1]) for i, (r, s) in enumerate(zip(self.rows, self.starts))]
        return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]


class BatchRows:
    """slm.model.block's Rows for B sequences of one position each (a Decoder is the other
    implementation): the shared base's configuration and vectors, and kernels and linear
    layers that give each row what its own Decoder would."""

    cfg: Config
    t: dict[str, QuantTensor]
    vectors: dict[str, np.ndarray]
    q_scale: np.float32 | None

    def __init__(self, rows: list[Row], kernels):
        first = rows[0].model
        self.rows = rows
        self.cfg, self.t, self.vectors, self.bias, self.q_scale = (first.cfg, first.t, first.vectors, first.bias,
                                                                    first.q_scale)
        self.kernels = RowKernels(kernels, rows)

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return self.linears(x, [name])[0]

    def attention(self, q: np.ndarray, keys: list, values: list, first: list, window: int = 0) -> np.ndarray:
        """q (B, nh, hd) -> (B, nh * hd): each row over its own cache, as its model does it."""
        return np.concatenate([r.model.attention(q[i:i + 1], keys[i], values[i], first[i], window)
                               for i, r in enumerate(self.rows)])

    def linears(self, x: np.ndarray, names: list[str]) -> list[np.ndarray]:
        """Decoder.linears for every row with its own overlays: the rows whose layers the fused
        kernel takes whole (no IA3 input scale) share one matmul_rows call, each row's LoRA
        term inside it; the others run their own model's linears alone."""
        weights = [self.t[n] for n in names]
        outs = [np.empty((x.shape[0], w.rows), dtype=np.float32) for w in weights]  # (B, out) each
        shared = self.kernels.takes(weights)
        together, alone = [], []
        for i, r in enumerate(self.rows):
            scaled = any(o.input_scale(n) is not None for o in r.model.overlays for n in names)
            (alone if scaled or not shared else together).append(i)
        for i in alone:
            for out, y in zip(outs, self.rows[i].model.linears(x[i:i + 1], names)):
                out[i] = y[0]
        if together:
            plans = [[self.rows[i].model.overlay_plan(n) for i in together] for n in names]  # (term, after) per row
            xs = x if len(together) == len(self.rows) else x[together]
            ys = self.kernels.base.matmul_rows(xs, weights, [[term for term, _ in p] for p in plans])
            for j, (name, y, plan) in enumerate(zip(names, ys, plans)):
                if name in self.bias:
                    y += self.bias[name]  # (B', out) + (out,)
                for k, (i, (_, after)) in enumerate(zip(together, plan)):
                    row_y = y[k:k + 1]
                    for overlay in after:  # IA3 output scales, sparse deltas: one row at a time
                        row_y = overlay.after(name, x[i:i + 1], row_y)
                    outs[j][i] = row_y[0]
        return outs


class RowKernels:
    """The kernel calls of a block for B rows: each call gets exactly the rows it would get in
    the single-sequence pass. The fused C kernels' row-wise functions (RMSNorm, RoPE, SwiGLU)
    take several sequences at once when each sequence is a short batch they take alone; NumPy
    math runs per sequence."""

    def __init__(self, base, rows: list[Row]):
        from slm.model.kernels_native import FUSED_MAX_TOKENS, MAX_JOBS, supports

        self.base, self.rows, self.B = base, rows, len(rows)
        self.short, self.max_jobs, self.supports = FUSED_MAX_TOKENS, MAX_JOBS, supports

    def takes(self, weights) -> bool:
        """Whether matmul_rows takes these weights in one call (else rows go alone)."""
        return len(weights) <= self.max_jobs and all(self.supports(w) and w.cols == weights[0].cols for w in weights)

    def _by_sequence(self, fn, x: np.ndarray, *per_row: np.ndarray, c_kernel: bool) -> np.ndarray:
        """fn over x (B * r rows, r per sequence) in calls of whole sequences: as many as the C
        kernel takes as one short batch, else one sequence per call."""
        r = x.shape[0] // self.B
        per = max(1, self.short // r) if c_kernel and r <= self.short else 1
        if per >= self.B:
            return fn(x, *per_row)
        parts = [fn(x[i * r:(i + per) * r], *(p[i:i + per] for p in per_row)) for i in range(0, self.B, per)]
        return np.concatenate(parts)

    def rms_norm(self, x, weight, eps):
        return self._by_sequence(lambda a: self.base.rms_norm(a, weight, eps), x, c_kernel=True)

    def rope(self, x, cos, sin, layout):
        return self._by_sequence(lambda a, c, s: self.base.rope(a, c, s, layout), x, cos, sin, c_kernel=True)

    def swiglu(self, gate, up):
        return self._by_sequence(self.base.swiglu, gate, up, c_kernel=True)

    def geglu(self, gate, up):
        return self._by_sequence(self.base.geglu, gate, up, c_kernel=True)

    def matmul(self, x, w):
        """The tied output head (block.logits): no overlays."""
        if self.takes([w]):
            return self.base.matmul_rows(x, [w], [[None] * x.shape[0]])[0]
        return np.concatenate([self.base.matmul(x[i:i + 1], w) for i in range(x.shape[0])])


if not set(ACTIVATION_KERNELS.values()) <= {"swiglu", "geglu"}:
    raise ImportError("slm.model.batch: a new activation needs a RowKernels method")
