"""The decode step in one native call: every layer of one token per sequence (slm_decode_step
in qkernels/step.c), for one sequence (Decoder.forward) or a batch of them (slm.model.batch).

The op-by-op path (slm.model.block over NativeKernels) crosses into C about ten times per layer
and opens a parallel region per linear layer; this path crosses once per step and opens one
region for all layers. It is the same arithmetic: each op inside is the C function the op path
calls, on the same values, so a sequence's logits are bit for bit the op path's
(tests/unit/test_step.py checks it for every family and weight type).

It takes a composition whose every linear layer the fused kernel has and whose overlays are
plain LoRA (fused as low-rank terms); anything else (an IA3 scale, a sparse delta, a weight
type without a C kernel, a float16 cache) takes the op path. What the family's description
says (q/k norms, post norms, biases, activation, windows, RoPE layout, query scale) becomes the
fields of one descriptor, built once per model: the C side never names a family.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from slm.model import kernels_native as kn
from slm.model import packed_copies
from slm.model.mathops import rope_tables

PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")  # P_Q .. P_DOWN
# slm_layer's norm fields, in order (a family without one leaves it NULL)
NORMS = ("attn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # slm_model.activation (ACT_SWIGLU, ACT_GEGLU in qkernels/ops.c)

_p, _i32, _i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64


class Linear(ctypes.Structure):
    """slm_linear: one base weight and its bias."""

    _fields_ = [("type", _i32), ("pad", _i32), ("data", _p), ("rows", _i64), ("row_bytes", _i64), ("bias", _p),
                ("packed", _p)]


class Layer(ctypes.Structure):
    """slm_layer: the seven weights, the norms (NULL: the family has none there), window, table."""

    _fields_ = [("w", Linear * len(PROJECTIONS)), *((n, _p) for n in NORMS), ("window", _i64), ("table", _i64)]


class Model(ctypes.Structure):
    """slm_model."""

    _fields_ = [("layers", _i64), ("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("head_dim", _i64),
                ("ffn", _i64), ("activation", _i32), ("interleaved", _i32), ("eps", ctypes.c_float),
                ("q_scale", ctypes.c_float), ("layer", _p), ("output_norm", _p), ("int8", _i32), ("pad", _i32)]


class Row(ctypes.Structure):
    """slm_row: one sequence of the batch."""

    _fields_ = [("position", _i64), ("k", _p), ("v", _p), ("slots", _p), ("terms", _p), ("rope", _p)]


def _signatures(lib) -> None:
    lib.slm_step_work_bytes.restype, lib.slm_step_work_bytes.argtypes = _i64, [_p, _i64, _p]
    lib.slm_decode_step.restype, lib.slm_decode_step.argtypes = _i32, [_p, _i64, _p, _p, _p, _p, _i64]


if kn.LIB is not None:
    _signatures(kn.LIB)


class _CacheView:
    """A KVCache's per-layer addresses, as the C side reads them (built once per cache: its
    arrays are allocated once and never move)."""

    def __init__(self, cache):
        n = len(cache.k)
        self.k = (_p * n)(*(a.ctypes.data for a in cache.k))
        self.v = (_p * n)(*(a.ctypes.data for a in cache.v))
        self.slots = (_i64 * n)(*(a.shape[0] for a in cache.k))


class NativeStep:
    """One model's descriptor for slm_decode_step, and its composition's low-rank terms.

    Built by `for_model`, which says None when the model needs the op path. The descriptor
    points into the model's arrays, which it keeps alive."""

    def __init__(self, model, terms: list):
        cfg = model.cfg
        self.model = model
        self.low_rank = terms  # per (layer, projection): None or (A, B^T), the arrays the terms point into
        self.keep = []
        layers = (Layer * cfg.num_layers)()
        for i, layer in enumerate(layers):
            p = f"blk.{i}."
            for j, role in enumerate(PROJECTIONS):
                name = p + role + ".weight"
                w, bias = model.t[name], model.bias.get(name)
                layer.w[j] = Linear(kn.kernel_type(w), 0, w.data.ctypes.data, w.rows, w.data.strides[0],
                                    None if bias is None else self._hold(bias))
            for norm in self._norms(cfg.desc):
                setattr(layer, norm, self._hold(model.vectors[p + norm + ".weight"]))
            layer.window = cfg.window(i)
            layer.table = int(cfg.layer_types[i] == "sliding_attention")
        self.layers = layers
        self.packed = False  # whether the int8 mode's packed rows are in the descriptor (_pack)
        self.desc = Model(cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                          cfg.intermediate_size, ACTIVATIONS[cfg.desc.activation], cfg.qk_row_layout == "gguf",
                          cfg.rms_norm_eps, 1.0 if model.q_scale is None else float(model.q_scale),
                          ctypes.addressof(layers), self._hold(model.vectors["output_norm.weight"]))
        # (layers, 7) slm_term: this composition's fused LoRA terms (rank 0: none), their int8
        # mode's factors added on the first int8 step (_int8_terms)
        self.terms = (kn.Term * (cfg.num_layers * len(PROJECTIONS)))()
        for k, term in enumerate(terms):
            if term is not None:
                self.terms[k] = kn.term_of(*term, int8=False)
        self.int8_terms = False
        # the RoPE base of table 0 (full layers) and, if any layer slides, of table 1
        sliding = any(t == "sliding_attention" for t in cfg.layer_types)
        self.bases = (cfg.rope_theta, cfg.rope_theta_local) if sliding else (cfg.rope_theta,)

    def _pack(self) -> None:
        """Points the descriptor at the int8 mode's packed rows (packed_copies.packed: built on the
        first int8 step, the same copies the op path reads)."""
        for i, layer in enumerate(self.layers):
            for j, role in enumerate(PROJECTIONS):
                pk = packed_copies.packed(self.model.t[f"blk.{i}.{role}.weight"])
                if pk is not None:
                    self.keep.append(pk)
                    layer.w[j].packed = pk.ctypes.data
        self.packed = True

    def _add_int8_terms(self) -> None:
        """Points the terms at the int8 mode's copies of their factors (int8_factors: built the
        first time any descriptor of the int8 mode asks, the same copies the op path reads)."""
        for k, term in enumerate(self.low_rank):
            if term is not None:
                self.terms[k] = kn.term_of(*term, int8=True)
        self.int8_terms = True

    @staticmethod
    def _norms(desc) -> list[str]:
        """The norms of a block of this family, as slm.model.block reads them."""
        return ["attn_norm", "ffn_norm", *(["attn_q_norm", "attn_k_norm"] if desc.qk_norm else []),
                *(["post_attention_norm", "post_ffw_norm"] if desc.post_norms else [])]

    def _hold(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a, dtype=np.float32)
        self.keep.append(a)
        return a.ctypes.data

    @classmethod
    def for_model(cls, model) -> "NativeStep | None":
        """The step for this model (its base and its overlays), or None when some part of it
        needs the op path."""
        cfg = model.cfg
        if kn.LIB is None or not isinstance(model.kernels, kn.NativeKernels) or \
                cfg.desc.activation not in ACTIVATIONS:
            return None
        terms = []
        for i in range(cfg.num_layers):
            for role in PROJECTIONS:
                name = f"blk.{i}.{role}.weight"
                w = model.t.get(name)
                if w is None or not kn.supports(w) or any(o.input_scale(name) is not None for o in model.overlays):
                    return None
                term, after = model.overlay_plan(name)
                if after:  # an IA3 scale or a sparse delta, applied after the kernel
                    return None
                terms.append(term)
        return cls(model, terms)

    @staticmethod
    def takes(cache) -> bool:
        """Whether the C side reads this cache (float32 arrays, C order). A cache with a view
        was taken before, and its arrays never change (so a batched step need not check its
        2 x layers arrays again at every step)."""
        return cache.native is not None or all(a.dtype == np.float32 and a.flags.c_contiguous
                                               for a in (*cache.k, *cache.v))

    def run(self, steps: list, x: np.ndarray, int8: bool | None = None) -> np.ndarray:
        """steps: [(NativeStep of the row's model, its KVCache)], all over this step's base;
        x (B, hidden) the embedded tokens. Runs every layer at each cache's next position
        (the caches gain it; their `length` is the caller's to advance) and returns the final
        hidden states after the output norm (B, hidden), the head's input. int8: int8
        activations (NativeKernels.set_activations); None: as this model's kernels say."""
        B, hd = len(steps), self.model.cfg.head_dim
        x = np.array(x, dtype=np.float32, order="C")  # (B, H): the residual stream, updated in place
        out = np.empty_like(x)
        rope = np.zeros((B, 2, 2, hd // 2), dtype=np.float32)  # (row, table, cos | sin, hd/2)
        rows = (Row * B)()
        for i, (step, cache) in enumerate(steps):
            view = cache.native
            if view is None:
                view = cache.native = _CacheView(cache)
            for t, base in enumerate(step.bases):
                rope[i, t] = _rope_row(hd, base, cache.length)
            rows[i] = Row(cache.length, ctypes.addressof(view.k), ctypes.addressof(view.v),
                          ctypes.addressof(view.slots), ctypes.addressof(step.terms),
                          rope.ctypes.data + i * rope.strides[0])
        self.desc.int8 = self.model.kernels.int8 if int8 is None else int8
        if self.desc.int8:
            for step in {id(s): s for s, _ in steps}.values():  # every row's terms, this step's packed rows
                if not step.int8_terms:
                    step._add_int8_terms()
            if not self.packed:
                self._pack()
        work = _work(kn.LIB.slm_step_work_bytes(ctypes.byref(self.desc), B, rows))
        status = kn.LIB.slm_decode_step(ctypes.byref(self.desc), B, rows, x.ctypes.data, out.ctypes.data,
                                        work.ctypes.data, work.nbytes)
        kn.check_status(status, "slm_decode_step", f"{B} sequence(s)")
        return out


@functools.lru_cache(maxsize=4096)
def _rope_row(head_dim: int, base: float, position: int) -> np.ndarray:
    """(cos | sin, hd/2) at one position, as the op path computes them (rope_tables of that
    position alone). Kept: the rows of a batch pass the same positions, and computing them
    again for every row is a visible part of a batched step."""
    cos, sin = rope_tables(head_dim, base, np.arange(position, position + 1))  # (1, hd/2) each
    table = np.stack([cos[0], sin[0]])
    table.flags.writeable = False
    return table


_WORK = threading.local()


def _work(nbytes: int) -> np.ndarray:
    """The step's working memory: one block per thread, grown when a step needs more (kept
    between steps, so a decode allocates it once)."""
    block = getattr(_WORK, "block", None)
    if block is None or block.nbytes < nbytes:
        block = _WORK.block = np.empty(nbytes, dtype=np.uint8)
    return block
