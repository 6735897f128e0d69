"""The transformer block and the logits head, as functions of the rows they run on.

`Rows` names everything a block and the head read: the configuration, the norm vectors, the
query scale, the kernels and three operations (linear, linears, attention). Two classes
implement it: `Decoder` (one sequence, its T positions as rows) and `slm.model.batch.BatchRows`
(B sequences of one position each, every row answered with its own composition and cache).
Because both run these same functions, a batched row goes through exactly the arithmetic of
the same sequence run alone: that is what keeps batched answers bit-identical to unbatched ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from slm.model.weights import QuantTensor

if TYPE_CHECKING:
    from slm.model.decoder import Config

# activation of the gated MLP -> the kernel-set method computing act(gate) * up
ACTIVATION_KERNELS = {"silu": "swiglu", "gelu_tanh": "geglu"}


class BlockKernels(Protocol):
    """The kernel calls a block and the head make (row-wise: each output row depends only on
    its own input row, or on its own sequence's rows)."""

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray: ...

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, layout: str) -> np.ndarray: ...

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray: ...

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray: ...

    def matmul(self, x: np.ndarray, w: QuantTensor) -> np.ndarray: ...


class BlockCache(Protocol):
    """Where a block puts the keys and values of its rows and finds the ones before them."""

    def extend(self, layer: int, start, k: np.ndarray, v: np.ndarray): ...


class Rows(Protocol):
    """What `block` and `logits` ask of the rows they run: exactly these names."""

    cfg: Config
    t: dict[str, QuantTensor]  # the base tensors (the head reads token_embd / output)
    vectors: dict[str, np.ndarray]  # norm weights, float32
    q_scale: np.float32 | None  # queries' extra scale (None: kernels.attend's own is right)

    @property
    def kernels(self) -> BlockKernels: ...

    def linear(self, x: np.ndarray, name: str) -> np.ndarray: ...

    def linears(self, x: np.ndarray, names: list[str]) -> list[np.ndarray]: ...

    def attention(self, q: np.ndarray, keys, values, first, window: int = 0) -> np.ndarray: ...


def logits(rows: Rows, x: np.ndarray) -> np.ndarray:
    """x (T, H) after the output norm -> logits (T, V)."""
    if "output.weight" in rows.t:
        y = rows.linear(x, "output.weight")  # (T, V)
    else:  # tied head: the embedding table doubles as the output projection
        y = rows.kernels.matmul(x, rows.t["token_embd.weight"])
    cap = rows.cfg.final_logit_softcap
    if cap:
        y = np.tanh(y / np.float32(cap)) * np.float32(cap)
    return y


def block(rows: Rows, layer: int, x: np.ndarray, cache: BlockCache, start,
          cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """One transformer layer over x (T, H): attention (keys and values go to `cache` from
    `start`), then the gated MLP, each with its residual."""
    cfg, desc, kern = rows.cfg, rows.cfg.desc, rows.kernels
    p, eps = f"blk.{layer}.", cfg.rms_norm_eps
    T, nh, nkv, hd = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    h = kern.rms_norm(x, rows.vectors[p + "attn_norm.weight"], eps)
    q, k, v = rows.linears(h, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
    if desc.qk_norm:  # one RMSNorm per head: (T * heads, hd) rows
        q = kern.rms_norm(q.reshape(T * nh, hd), rows.vectors[p + "attn_q_norm.weight"], eps)
        k = kern.rms_norm(k.reshape(T * nkv, hd), rows.vectors[p + "attn_k_norm.weight"], eps)
    q = kern.rope(q.reshape(T, nh, hd), cos, sin, cfg.qk_row_layout)
    k = kern.rope(k.reshape(T, nkv, hd), cos, sin, cfg.qk_row_layout)
    if rows.q_scale is not None:
        q *= rows.q_scale
    keys, values, first = cache.extend(layer, start, k, v.reshape(T, nkv, hd))
    a = rows.linear(rows.attention(q, keys, values, first, cfg.window(layer)), p + "attn_output.weight")
    if desc.post_norms:
        a = kern.rms_norm(a, rows.vectors[p + "post_attention_norm.weight"], eps)
    x = x + a
    h = kern.rms_norm(x, rows.vectors[p + "ffn_norm.weight"], eps)
    gate, up = rows.linears(h, [p + "ffn_gate.weight", p + "ffn_up.weight"])  # (T, F) each
    act = getattr(kern, ACTIVATION_KERNELS[desc.activation])
    f = rows.linear(act(gate, up), p + "ffn_down.weight")
    if desc.post_norms:
        f = kern.rms_norm(f, rows.vectors[p + "post_ffw_norm.weight"], eps)
    return x + f
