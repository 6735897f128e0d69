"""Fused C kernels vs the NumPy reference path: agreement within 1e-5 relative on every type."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import random_overlay

from slm import quant
from slm.model import kernels_native
from slm.model.kernels import ReferenceKernels
from slm.model.weights import quant_tensor


def _quantized(codec, tokens):
    rng = np.random.default_rng([tokens, *codec.encode()])  # (hash() of a str varies by process)
    shape = (96, 256)
    w = rng.standard_normal(shape).astype(np.float32) * 0.05
    w[5, :32] = 0.0  # an all-zero block
    w[7, 40] = 3.0  # an outlier
    tensor = quant_tensor("w", shape, codec, quant.get_codec(codec).quantize(w).tobytes())
    return tensor, rng.standard_normal((tokens, shape[1])).astype(np.float32)


@pytest.mark.parametrize("codec", ["q8_0", "q4_0", "q4_1", "nf4"])
@pytest.mark.parametrize("tokens", [1, 3, 8, 12])
def test_fused_matches_reference(codec, tokens):
    tensor, x = _quantized(codec, tokens)
    assert kernels_native.supports(tensor)
    ref = ReferenceKernels().matmul(x, tensor)
    fused = kernels_native.NativeKernels().matmul(x, tensor)
    scale = np.abs(ref).max()
    assert np.abs(fused - ref).max() <= 1e-5 * scale


def _float_weight(raw: bytes, codec: str, shape) -> np.ndarray:
    """The weight of a float codec decoded from its bytes with NumPy alone, not slm.quant:
    little-endian IEEE f32 / f16, and bf16 as the high half of an f32."""
    if codec == "bf16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(raw, {"f16": "<f2", "f32": "<f4"}[codec]).astype(np.float32).reshape(shape)


@pytest.mark.parametrize("codec", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("tokens", [1, 12])
def test_float_types_match_an_independent_product(codec, tokens):
    """Both kernel sets against x @ W.T in float64 over a W decoded independently (the C
    kernels have no float types today and fall back to the NumPy path: comparing the two
    with each other would prove nothing)."""
    tensor, x = _quantized(codec, tokens)
    raw = tensor.data.tobytes()
    expected = x.astype(np.float64) @ _float_weight(raw, codec, tensor.shape).astype(np.float64).T  # (T, out)
    scale = np.abs(expected).max()
    for kernels in (ReferenceKernels(), kernels_native.NativeKernels()):
        got = kernels.matmul(x, tensor)
        assert got.shape == expected.shape and got.dtype == np.float32
        assert np.abs(got - expected).max() <= 1e-5 * scale, type(kernels).__name__


def test_fused_model_matches_reference(tiny_model, store):
    from slm.ops.store.importing import import_base
    from slm.ops.infer.loading import load_base_model

    import_base(store, tiny_model["gguf_q"], "tq")
    import_base(store, tiny_model["hf"], "nf", quant="nf4")
    ids = np.asarray([5, 17, 42, 99, 123, 7])
    for name in ("tq", "nf"):
        loaded = load_base_model(store, name)
        model = loaded.model
        model.kernels = ReferenceKernels()
        ref = [model.forward(ids[:1], c := model.new_cache(8), "last")]
        ref += [model.forward(ids[i:i + 1], c, "last") for i in range(1, 6)]
        model.kernels = kernels_native.NativeKernels()
        out = [model.forward(ids[:1], c2 := model.new_cache(8), "last")]
        out += [model.forward(ids[i:i + 1], c2, "last") for i in range(1, 6)]
        np.testing.assert_allclose(np.concatenate(out), np.concatenate(ref), rtol=1e-4, atol=1e-4)


def test_fused_low_rank_matches_reference_overlays(tiny_model, store):
    """LoRAs added inside the C kernel (one, or two stacked, or followed by an IA3 scale that
    forbids the fusion on that layer) give the reference overlays' logits within 1e-5."""
    from slm.ops.store.importing import import_base
    from slm.ops.infer.loading import load_base_model

    import_base(store, tiny_model["gguf_q"], "tq")
    model = load_base_model(store, "tq").model
    rng = np.random.default_rng(7)
    linear = [n for n, w in model.t.items() if len(w.shape) == 2 and n.startswith("blk.")]
    model.overlays = [random_overlay("lora", model, rng, linear),
                      random_overlay("lora", model, rng, [n for n in linear if "attn" in n]),
                      random_overlay("ia3", model, rng, [n for n in linear if "attn_v" in n])]
    ids = np.asarray([5, 17, 42, 99, 123, 7])
    logits = {}
    for kernels in (ReferenceKernels(), kernels_native.NativeKernels()):
        model.kernels = kernels
        cache = model.new_cache(8)
        logits[kernels.name] = np.concatenate([model.forward(ids[:2], cache, "all")] +
                                              [model.forward(ids[i:i + 1], cache) for i in range(2, 6)])
    fused_terms = [t for (_, fuses), (t, _) in model._plans.items() if fuses and t is not None]
    assert fused_terms, "the fused path was not taken"
    ref = logits["numpy-reference"]
    assert np.abs(logits["c-fused"] - ref).max() <= 1e-5 * np.abs(ref).max()


class _ProtocolOnly:
    """An overlay that offers exactly the methods of slm.model.decoder.Overlay (delegated to
    a real one) and nothing else: an executor reaching past the protocol fails on it."""

    def __init__(self, inner):
        from slm.model.decoder import Overlay

        members = [n for n in vars(Overlay) if not n.startswith("_")]
        assert {"targets", "input_scale", "after"} <= set(members)
        for name in members:
            setattr(self, name, getattr(inner, name))


def test_the_executor_uses_overlays_only_through_their_protocol(tiny_model, store):
    """The Overlay protocol lists every method the executor calls (targets() was missing, and
    the fused plan read the LoRA dictionaries directly): overlays offering only the protocol
    give the real overlays' logits bit for bit, on both kernel sets, IA3 input scales and
    sparse deltas included."""
    from slm.model.overlays import TargetData, build_overlay
    from slm.ops.store.importing import import_base
    from slm.ops.infer.loading import load_base_model

    import_base(store, tiny_model["gguf_q"], "tq")
    model = load_base_model(store, "tq").model
    rng = np.random.default_rng(11)
    linear = [n for n, w in model.t.items() if len(w.shape) == 2 and n.startswith("blk.")]
    down = [n for n in linear if "ffn_down" in n]
    ia3_in = build_overlay("ia3", 0.5, [TargetData(n, *model.t[n].shape, {"vector": (
        1 + 0.1 * rng.standard_normal(model.t[n].shape[1])).astype(np.float32)}, 1.0, "input")
        for n in down], src_layout="gguf", dst_layout="gguf", heads={})
    out_f, in_f = model.t[linear[0]].shape
    flat = rng.choice(out_f * in_f, size=40, replace=False).astype(np.int64)
    sparse = build_overlay("sparse", 1.3, [TargetData(linear[0], out_f, in_f, {
        "indices": np.sort(flat), "values": rng.standard_normal(40).astype(np.float32)}, 1.0)],
        src_layout="gguf", dst_layout="gguf", heads={})
    real = [random_overlay("lora", model, rng, linear), ia3_in, sparse,
            random_overlay("ia3", model, rng, [n for n in linear if "attn_v" in n])]
    ids = np.asarray([5, 17, 42, 99, 123, 7])
    for kernels in (ReferenceKernels(), kernels_native.NativeKernels()):
        model.kernels = kernels
        outs = []
        for overlays in (real, [_ProtocolOnly(o) for o in real]):
            model.overlays = overlays
            cache = model.new_cache(8)
            outs.append(np.concatenate([model.forward(ids[:3], cache, "all")] +
                                       [model.forward(ids[i:i + 1], cache) for i in range(3, 6)]))
        assert outs[0].tobytes() == outs[1].tobytes(), kernels.name


@pytest.mark.parametrize("layout", ["gguf", "hf"])
def test_decode_step_helpers_match_numpy(layout):
    """RMSNorm, RoPE, one-token GQA attention and SwiGLU in C vs their NumPy definitions."""
    from slm.model import mathops

    rng = np.random.default_rng(3)
    fused, ref = kernels_native.NativeKernels(), ReferenceKernels()

    def close(a, b):
        assert a.shape == b.shape and a.dtype == b.dtype == np.float32
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(b).max())

    x = rng.standard_normal((3, 96)).astype(np.float32) * 4
    w = rng.standard_normal(96).astype(np.float32)
    close(fused.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5))
    q = rng.standard_normal((2, 6, 16)).astype(np.float32)
    cos, sin = mathops.rope_tables(16, 10000.0, np.array([7, 300]))
    close(fused.rope(q, cos, sin, layout), ref.rope(q, cos, sin, layout))
    # head sizes that take every register block of the values' weighted sum on AVX2 and
    # AVX-512 (3 and 1 vectors) and the scalar tail (20, 80); key counts under, at and past
    # the scores' blocks of 16 keys; groups of 3 query heads a kv head, and of 5 (calls of
    # 4 heads and of 1)
    for head_dim in (16, 20, 64, 80, 256):
        for seen in (1, 2, 16, 17, 45):  # positions in the cache, the new one included
            for heads in (6, 10):
                q1 = rng.standard_normal((1, heads, head_dim)).astype(np.float32)
                k = rng.standard_normal((seen, 2, head_dim)).astype(np.float32) * 3
                v = rng.standard_normal((seen, 2, head_dim)).astype(np.float32)
                close(fused.attend(q1, k, v, seen - 1), ref.attend(q1, k, v, seen - 1))
    gate, up = (rng.standard_normal((2, 40)).astype(np.float32) * 5 for _ in range(2))
    close(fused.swiglu(gate, up), ref.swiglu(gate, up))
    close(fused.geglu(gate, up), ref.geglu(gate, up))


@pytest.mark.parametrize("first,window", [(0, 0), (13, 0), (0, 5), (9, 4), (30, 64)])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(6, 2, 16), (4, 1, 256), (3, 3, 20), (40, 2, 8)])
def test_causal_attention_matches_numpy(first, window, heads, kv_heads, head_dim):
    """A prompt's attention in C (tiles of query rows sharing their keys, only the keys of a
    tile's range scored) against the NumPy definition that masks a dense product: GQA (6 heads
    on 2; Gemma 3's 4 on 1 at 256 values a head; 20 per kv head, more than a tile's rows), plain
    multi-head with a head size no vector width divides, queries after cached positions,
    windows shorter and longer than the prompt, 1 and 2 threads, on the prefill's own threads
    (float32 mode) and on the OpenMP team (int8 mode: the same tiles, the same bits)."""
    from slm.model import mathops

    rng = np.random.default_rng([first, window, heads, head_dim])
    T = 37
    q = rng.standard_normal((T, heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((first + T, kv_heads, head_dim)).astype(np.float32) * 3
    v = rng.standard_normal((first + T, kv_heads, head_dim)).astype(np.float32)
    want = mathops.attend(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), first, window)
    fused = kernels_native.NativeKernels()
    outs = []
    for mode in ("float32", "int8"):
        fused.set_activations(mode)
        for threads in (1, 2):
            fused.set_threads(threads)
            outs.append(fused.attend_causal(q, k, v, first, window))
            assert outs[-1].shape == want.shape and outs[-1].dtype == np.float32
            assert np.abs(outs[-1] - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert len({out.tobytes() for out in outs}) == 1  # each tile computed whole by one thread


def test_causal_attention_passes_nan_through():
    """A NaN in one key reaches exactly the queries that see that key (the vector exp keeps
    NaN; a key outside a query's range weighs 0 and leaves it finite)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((12, 4, 32)).astype(np.float32)
    k = rng.standard_normal((12, 2, 32)).astype(np.float32)
    v = rng.standard_normal((12, 2, 32)).astype(np.float32)
    k[6, 1, 3] = np.nan
    out = kernels_native.NativeKernels().attend_causal(q, k, v, 0, 0).reshape(12, 4, 32)
    sees = np.isnan(out).any(axis=2)  # (position, head)
    assert not sees[:6].any() and not sees[6:, :2].any() and sees[6:, 2:].all()


def test_results_do_not_depend_on_thread_count(tiny_model, store):
    """Each output is computed whole by one thread in a fixed order, and the prefill's chunks
    and query ranges do not depend on the thread count: 1 and 2 threads agree bit for bit,
    with fused LoRA terms and through a long prompt (dequantize + BLAS) and decode steps."""
    from slm.ops.store.importing import import_base
    from slm.ops.infer.loading import load_base_model

    import_base(store, tiny_model["gguf_q"], "tq")
    model = load_base_model(store, "tq").model
    rng = np.random.default_rng(11)
    linear = [n for n, w in model.t.items() if len(w.shape) == 2 and n.startswith("blk.")]
    model.overlays = [random_overlay("lora", model, rng, linear)]
    model.kernels = kernels_native.NativeKernels()
    prompt = rng.integers(0, model.cfg.vocab_size, 70)  # long enough for the two-range attention
    runs = []
    for threads in (1, 2):
        model.kernels.set_threads(threads)
        cache = model.new_cache(80)
        steps = [model.forward(prompt, cache, "all")]
        steps += [model.forward(np.asarray([int(np.argmax(steps[-1][-1]))]), cache) for _ in range(4)]
        runs.append(np.concatenate(steps))
    assert runs[0].tobytes() == runs[1].tobytes()


def test_run_threads_option(cli, store, tiny_model, tmp_path):
    from slm.ops.store.importing import import_base

    import_base(store, tiny_model["gguf_q"], "tq")
    texts = []
    for threads in ("1", "2"):
        r = cli("--store", store.root, "run", "hello there", "--base", "tq", "-n", "6", "--threads", threads,
                "--json")
        assert r.code == 0, r.err
        texts.append(r.json()["tokens"])
    assert texts[0] == texts[1]
    r = cli("--store", store.root, "run", "hello", "--base", "tq", "--threads", "0")
    assert r.code == 4 and "--threads" in r.err and r.err.count("\n") <= 1


# ------------------------------------------------ the finite check an activation runs (no NumPy)

@pytest.mark.parametrize("path", ["c", "numpy"])
def test_the_finite_check_finds_every_non_finite_float32(monkeypatch, path):
    """slm.model.finite against NumPy's isfinite: every class of float32 (NaN payloads, both
    infinities, the largest finite, subnormals, -0) at the first, a middle and the last place of
    lengths around the vector widths; the NumPy fallback (kernels not built) gives the same."""
    from slm.model import finite

    if path == "numpy":
        monkeypatch.setattr(finite, "_check", lambda: None)
    else:
        assert finite._check() is not None
    specials = np.array([0x7FC00000, 0x7FC00001, 0xFF800001, 0x7F800001, 0x7F800000, 0xFF800000,
                         0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000000], dtype="<u4").view("<f4")
    base = np.random.default_rng(0).standard_normal(70).astype("<f4")
    assert finite.f32_all_finite(b"")
    for n in (1, 7, 8, 9, 16, 33, 70):
        assert finite.f32_all_finite(base[:n].tobytes())
        for where in {0, n // 2, n - 1}:
            for value in specials:
                values = base[:n].copy()
                values[where] = value
                assert finite.f32_all_finite(values.tobytes()) == bool(np.isfinite(values).all()), (n, where, value)
    with pytest.raises(ValueError):
        finite.f32_all_finite(b"\0" * 6)


# ----------------------------------------------- int8 activations (the default mode), exactly

def _int8_codes(ggml_type, raw: np.ndarray):
    """(d, m, q) of every block of raw (rows, bytes per row), from the block layouts of
    ggml-common.h: d, m float64 (rows, blocks), q int64 (rows, blocks, 32) in value order."""
    import gguf

    T = gguf.GGMLQuantizationType
    size = gguf.GGML_QUANT_SIZES[ggml_type][1]
    b = raw.reshape(raw.shape[0], -1, size)

    def f16(a):
        return a.copy().view("<f2")[..., 0].astype(np.float64)

    def nibbles(qs):
        return np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int64)

    def fifth_bits(qh):
        bits = qh.copy().view("<u4")[..., 0]
        return ((bits[..., None] >> np.arange(32)) & 1).astype(np.int64) << 4

    d, m = f16(b[..., 0:2]), np.zeros(b.shape[:2])
    if ggml_type == T.Q8_0:
        q = b[..., 2:34].view(np.int8).astype(np.int64)
    elif ggml_type == T.Q4_0:
        q = nibbles(b[..., 2:18]) - 8
    elif ggml_type == T.Q4_1:
        m, q = f16(b[..., 2:4]), nibbles(b[..., 4:20])
    elif ggml_type == T.Q5_0:
        q = (nibbles(b[..., 6:22]) | fifth_bits(b[..., 2:6])) - 16
    else:  # Q5_1
        m, q = f16(b[..., 2:4]), nibbles(b[..., 8:24]) | fifth_bits(b[..., 4:8])
    return d, m, q


def _int8_inputs(x: np.ndarray):
    """x (T, n) as the int8 mode quantizes it, per 32 values in float32: q = rint(x * 127 / amax)
    (round half to even), dx = amax / 127. -> q (T, n/32, 32) int64, dx (T, n/32) float64."""
    xb = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint((xb * inv[..., None]).astype(np.float32)).astype(np.int64)
    return q, (amax / np.float32(127)).astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
@pytest.mark.parametrize("tokens", [1, 3, 4, kernels_native.FUSED_MAX_TOKENS])
def test_int8_activations_are_integer_dot_products(name, tokens):
    """Each output is sum over blocks of dw * dx * (qw . qx) (+ m * dx * sum(qx), the rounded block's sum): the
    integer products exact, against this independent NumPy evaluation in float64 (adversarial
    blocks included: zero rows, extreme codes and scales); each row alone gives the same bits."""
    import gguf
    from test_kernels_kquants import blocks, tensor

    T = gguf.GGMLQuantizationType[name]
    raw = blocks(T, 37, 768, seed=3)
    w = tensor(T, raw)
    x = np.random.default_rng(tokens).standard_normal((tokens, 768)).astype(np.float32)
    x[0, :32] = 0.0  # a block of zeros: dx = 0
    kern = kernels_native.NativeKernels()
    kern.set_activations("int8")
    got = kern.matmul(x, w)  # (T, 37)
    d, m, q = _int8_codes(T, raw)
    qx, dx = _int8_inputs(x)
    sums = dx * qx.sum(-1)  # (T, blocks): the rounded blocks' sums, as the min term takes them
    terms = np.einsum("rbi,tbi->trb", q, qx) * d[None] * dx[:, None] + m[None] * sums[:, None]  # (T, rows, blocks)
    want = terms.sum(-1)
    assert np.all(np.abs(got - want) <= 1e-5 * np.abs(terms).sum(-1) + 1e-30)
    for t in range(tokens):
        assert kern.matmul(x[t:t + 1], w)[0].tobytes() == got[t].tobytes()
    kern.set_activations("float32")
    assert not np.array_equal(kern.matmul(x, w), got)  # the mode was in effect
    # a longer input (a prompt's chunk) runs the dequantized BLAS product, in float32 either way
    # (but for the types whose packed kernels take prompts in the int8 mode: test_kernels_int8.py)
    long = np.random.default_rng(0).standard_normal((kernels_native.FUSED_MAX_TOKENS + 1, 768)).astype(np.float32)
    want_long = kern.matmul(long, w)
    kern.set_activations("int8")
    if kernels_native.kernel_type(w) not in kernels_native.INT8_LONG_TYPES:
        assert kern.matmul(long, w).tobytes() == want_long.tobytes()


def test_int8_mode_keeps_float_activations_for_the_other_types_and_passes_nan_through():
    import gguf
    from test_kernels_kquants import blocks, tensor

    x = np.random.default_rng(0).standard_normal((2, 768)).astype(np.float32)
    f, i8 = kernels_native.NativeKernels(), kernels_native.NativeKernels()
    i8.set_activations("int8")
    for name in ("Q2_K", "Q3_K"):  # (Q4_K, Q5_K, Q6_K take int8: test_kernels_int8.py)
        w = tensor(gguf.GGMLQuantizationType[name], blocks(gguf.GGMLQuantizationType[name], 5, 768, seed=1))
        assert i8.matmul(x, w).tobytes() == f.matmul(x, w).tobytes(), name
    w = tensor(gguf.GGMLQuantizationType.Q4_1, blocks(gguf.GGMLQuantizationType.Q4_1, 5, 768, seed=1))
    x[1, 100] = np.nan
    y = i8.matmul(x, w)
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all()
    with pytest.raises(ValueError, match="activations"):
        i8.set_activations("int4")
