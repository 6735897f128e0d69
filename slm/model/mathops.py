"""The NumPy math of a decoder block besides the linear layers: the reference definitions.

The kernel sets (slm.model.kernels) call these; the fused C kernels replace some of them for
short batches and are differential-tested against them.
"""

from __future__ import annotations

import math

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    # x: (T, H); statistics in float32 like the reference implementation
    variance = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x / np.sqrt(variance + np.float32(eps))) * weight


def silu(x: np.ndarray) -> np.ndarray:
    d = np.negative(x)  # x / (1 + exp(-x)), in one scratch array
    np.exp(d, out=d)
    d += np.float32(1.0)
    return np.divide(x, d, out=d)


def rope_tables(head_dim: int, theta: float, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape (T, head_dim/2) for the given positions."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    angles = positions.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, layout: str) -> np.ndarray:
    """Rotate x (T, heads, hd) by position. The pairs rotated together depend on the q/k row
    layout: GGUF interleaves them (2i, 2i+1); Hugging Face splits halves (i, i + hd/2)."""
    c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, hd/2)
    if layout == "gguf":
        even, odd = x[..., 0::2], x[..., 1::2]  # (T, heads, hd/2) each
        out = np.empty_like(x)
        out[..., 0::2] = even * c - odd * s
        out[..., 1::2] = odd * c + even * s
        return out
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * c - second * s, second * c + first * s], axis=-1)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = x - np.max(x, axis=axis, keepdims=True)
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return silu(gate) * up  # (T, F)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (transformers' gelu_pytorch_tanh, GGML's gelu):
    x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    inner = np.float32(math.sqrt(2.0 / math.pi)) * (x + np.float32(0.044715) * x * x * x)
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return gelu_tanh(gate) * up  # (T, F)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, first: int, window: int = 0) -> np.ndarray:
    """Grouped-query attention for queries at positions first.. ; q (T, nh, hd); k, v
    (S, n_kv, hd) with S = first + T. With a window, query t sees only keys
    first + t - window + 1 .. first + t (a sliding layer).

    Query head h uses kv head h // group; each kv head's queries are stacked so that both
    products are batched matrix multiplications (BLAS)."""
    T, nh, hd = q.shape
    S, n_kv = k.shape[0], k.shape[1]
    group = nh // n_kv
    qg = q.reshape(T, n_kv, group, hd).transpose(1, 2, 0, 3).reshape(n_kv, group * T, hd)
    scores = np.matmul(qg, k.transpose(1, 2, 0))  # (n_kv, g*T, S)
    scores *= np.float32(1.0 / np.sqrt(hd))
    scores = scores.reshape(n_kv, group, T, S)
    if T > 1 or window:  # query t sits at position first + t and sees keys 0..first + t
        behind = (first + np.arange(T))[:, None] - np.arange(S)[None, :]  # (T, S) query - key
        hidden = behind < 0  # the future
        if window:
            hidden |= behind >= window  # older than the window
        scores[:, :, hidden] = np.float32(-np.inf)
    probs = softmax(scores, axis=-1).reshape(n_kv, group * T, S)
    out = np.matmul(probs, v.transpose(1, 0, 2))  # (n_kv, g*T, hd)
    out = out.reshape(n_kv, group, T, hd).transpose(2, 0, 1, 3)  # (T, n_kv, g, hd)
    return out.reshape(T, nh * hd).astype(q.dtype, copy=False)
