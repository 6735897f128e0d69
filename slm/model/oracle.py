"""The fresh-base oracle: the composition's math done the other way round, in float64.

Where the executor keeps the base quantized, adds overlays around each layer in float32,
caches keys (in rings, for sliding layers) and hands attention to kernels, the oracle builds
every weight densely in float64 straight from the stored bytes,

    W' = dequant(W_q) + sum_i w_i * dW_i          (float64, no intermediate quantization)
    LoRA  dW = scale * B @ A          IA3  W' = diag(1 + w (v - 1)) W  (or W diag(...) for inputs)
    sparse dW[r, c] += scale * value  a bias is scaled by every IA3 output vector after it

in the adapter's own row layout, then moves the whole delta into the base's q/k row layout,
and runs the whole sequence at once: RoPE as a complex rotation, grouped-query attention by
repeating the kv heads, one explicit (T, T) mask from positions and windows.

It shares no code with the executor (slm.model.decoder, mathops, kernels, overlays; TargetData
is a plain record): only the architecture description it implements (slm.arch, data) and the
codecs that decode the bytes.
So a wrong scale, sign, row order, norm or window in either shows as a difference.
"""

from __future__ import annotations

import numpy as np

from slm import arch as archs
from slm.arch.roles import qk_heads
from slm.model.overlays import TargetData
from slm.model.weights import QuantTensor

HEAD_CHUNK_ROWS = 8192  # an un-adapted head is multiplied in row chunks (Gemma: 262144 rows)
ACTIVATIONS = {  # slm.arch.ACTIVATIONS, in float64
    "silu": lambda g: g / (1.0 + np.exp(-g)),
    "gelu_tanh": lambda g: 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3))),
}


class OracleAdapter:
    def __init__(self, kind: str, weight: float, targets: list[TargetData], src_layout: str):
        self.kind, self.weight, self.src_layout = kind, float(weight), src_layout
        self.targets = {t.module: t for t in targets}


def _gguf_order(n_rows: int, n_heads: int) -> np.ndarray:
    """idx with rows_gguf = rows_hf[idx]: in each head of d rows, GGUF row 2j + s is Hugging
    Face row s * d/2 + j (s = 0, 1; slm.arch.QK_LAYOUTS)."""
    d = n_rows // n_heads
    head, within = np.divmod(np.arange(n_rows), d)
    j, s = np.divmod(within, 2)
    return head * d + s * (d // 2) + j


class Oracle:
    """logits(ids) of a base manifest's architecture over its tensors, with adapters merged."""

    def __init__(self, arch: dict, qk_row_layout: str, tensors: dict[str, QuantTensor],
                 adapters: list[OracleAdapter] = ()):
        self.arch, self.layout, self.t = arch, qk_row_layout, tensors
        self.desc = archs.get(arch["family"])
        self.adapters = list(adapters)
        self.heads = qk_heads(arch)

    # ---------------------------------------------------------------- weights
    def _base_rows(self, module: str, rows: np.ndarray, src: str) -> np.ndarray:
        """Rows of an adapter delta (or output vector) moved from `src` into the base's layout."""
        role = module.split(".")[-2]
        if role not in self.heads or src == self.layout:
            return rows
        idx = _gguf_order(rows.shape[0], self.heads[role])
        return rows[idx] if self.layout == "gguf" else rows[np.argsort(idx)]

    def merged(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """(W' (out, in), b' (out,) or None) in float64, merged afresh."""
        W = self.t[name].dequantize().astype(np.float64)
        bias_name = name.removesuffix(".weight") + ".bias"
        b = self.t[bias_name].dequantize().astype(np.float64).reshape(-1) if bias_name in self.t else None
        for a in self.adapters:
            t = a.targets.get(name)
            if t is None:
                continue
            if a.kind == "lora":
                delta = t.scale * (t.tensors["B"].astype(np.float64) @ t.tensors["A"].astype(np.float64))
                W = W + a.weight * self._base_rows(name, delta, a.src_layout)
            elif a.kind == "ia3":
                v = 1.0 + a.weight * (t.tensors["vector"].astype(np.float64) - 1.0)
                if t.ia3_on == "input":
                    W = W * v[None, :]
                else:
                    v = self._base_rows(name, v, a.src_layout)
                    W, b = W * v[:, None], (None if b is None else b * v)
            else:
                delta = np.zeros(W.shape)
                rows, cols = np.divmod(t.tensors["indices"].astype(np.int64), W.shape[1])
                np.add.at(delta, (rows, cols), t.scale * t.tensors["values"].astype(np.float64))
                W = W + a.weight * self._base_rows(name, delta, a.src_layout)
        return W, b

    def weight(self, name: str) -> np.ndarray:
        return self.merged(name)[0]

    def product(self, x: np.ndarray, name: str) -> np.ndarray:
        """x (T, in) @ W'^T (+ b') in float64."""
        if name in ("output.weight", "token_embd.weight") and not any(name in a.targets for a in self.adapters):
            w = self.t[name]  # the head: un-adapted, in row chunks
            return np.concatenate([x @ w.dequantize_rows(i, min(i + HEAD_CHUNK_ROWS, w.rows)).astype(np.float64).T
                                   for i in range(0, w.rows, HEAD_CHUNK_ROWS)], axis=1)
        W, b = self.merged(name)
        return x @ W.T if b is None else x @ W.T + b

    def vector(self, name: str) -> np.ndarray:
        return self.t[name].dequantize().astype(np.float64).reshape(-1)

    # ---------------------------------------------------------------- the forward pass
    def norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.arch["rms_norm_eps"]) * self.vector(name)

    def rotate(self, x: np.ndarray, theta: float) -> np.ndarray:
        """RoPE on x (T, heads, d): each pair of rows is a complex number turned by pos * freq."""
        T, _, d = x.shape
        freq = theta ** (-np.arange(0, d, 2) / d)  # (d/2,)
        turn = np.exp(1j * np.arange(T)[:, None, None] * freq[None, None, :])  # (T, 1, d/2)
        if self.layout == "gguf":  # pairs (2j, 2j+1)
            z = (x[..., 0::2] + 1j * x[..., 1::2]) * turn
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = z.real, z.imag
            return out
        z = (x[..., : d // 2] + 1j * x[..., d // 2:]) * turn  # pairs (j, j + d/2)
        return np.concatenate([z.real, z.imag], axis=-1)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int) -> np.ndarray:
        """q (T, nh, d); k, v (T, nkv, d) -> (T, nh * d); position t sees s <= t (and t - s < window)."""
        T, nh, d = q.shape
        group = nh // k.shape[1]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # head h -> kv head h // group
        scale = self.arch.get("query_pre_attn_scalar", float(d)) ** -0.5
        scores = np.einsum("qhd,khd->hqk", q, k) * scale  # (nh, T, T)
        t, s = np.arange(T)[:, None], np.arange(T)[None, :]
        allowed = (s <= t) & ((t - s < window) if window else True)
        scores = np.where(allowed[None], scores, -np.inf)
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        return np.einsum("hqk,khd->qhd", p, v).reshape(T, nh * d)

    def logits(self, ids) -> np.ndarray:
        """(T, V) float64 logits of the token ids at positions 0..T-1."""
        arch, desc = self.arch, self.desc
        ids = np.asarray(ids)
        T, nh, nkv, d = len(ids), arch["num_heads"], arch["num_kv_heads"], arch["head_dim"]
        x = self.t["token_embd.weight"].take_rows(ids).astype(np.float64)  # (T, H)
        if desc.embedding_scale:
            x = x * np.sqrt(arch["hidden_size"])
        kinds = arch.get("layer_types", ["full_attention"] * arch["num_layers"])
        for i in range(arch["num_layers"]):
            p = f"blk.{i}."
            sliding = kinds[i] == "sliding_attention"
            theta = arch.get("rope_theta_local", arch["rope_theta"]) if sliding else arch["rope_theta"]
            h = self.norm(x, p + "attn_norm.weight")
            q = self.product(h, p + "attn_q.weight").reshape(T, nh, d)
            k = self.product(h, p + "attn_k.weight").reshape(T, nkv, d)
            v = self.product(h, p + "attn_v.weight").reshape(T, nkv, d)
            if desc.qk_norm:
                q, k = self.norm(q, p + "attn_q_norm.weight"), self.norm(k, p + "attn_k_norm.weight")
            a = self.attention(self.rotate(q, theta), self.rotate(k, theta), v,
                               arch.get("sliding_window", 0) if sliding else 0)
            a = self.product(a, p + "attn_output.weight")
            if desc.post_norms:
                a = self.norm(a, p + "post_attention_norm.weight")
            x = x + a
            h = self.norm(x, p + "ffn_norm.weight")
            g, u = self.product(h, p + "ffn_gate.weight"), self.product(h, p + "ffn_up.weight")
            f = self.product(ACTIVATIONS[desc.activation](g) * u, p + "ffn_down.weight")
            if desc.post_norms:
                f = self.norm(f, p + "post_ffw_norm.weight")
            x = x + f
        x = self.norm(x, "output_norm.weight")
        y = self.product(x, "output.weight" if "output.weight" in self.t else "token_embd.weight")
        cap = arch.get("final_logit_softcap", 0.0)
        return cap * np.tanh(y / cap) if cap else y
