"""The int8 mode's LoRA factors (slm/model/int8_factors.py, qkernels/low_rank.c): A as Q8_0 rows
dotted in integers with the int8 input, B^T as halves in tiles; the exact mode's float32 factors
untouched; batched, native-step and thread-count results unchanged bit for bit."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from helpers import random_overlay
from test_kernels import _int8_codes, _int8_inputs
from test_kernels_kquants import blocks, tensor

from slm.model import kernels_native, modes
from slm.model.int8_factors import BT_TILE, int8_factors, untiled

T = gguf.GGMLQuantizationType


def _weight_and_term(rows: int, cols: int, rank: int, seed: int):
    rng = np.random.default_rng(seed)
    w = tensor(T.Q4_0, blocks(T.Q4_0, rows, cols, seed=seed, adversarial=False))
    a = (rng.standard_normal((rank, cols)) / np.sqrt(cols)).astype(np.float32)
    b_t = (0.1 * rng.standard_normal((rank, rows))).astype(np.float32)
    return w, (a, b_t), rng


@pytest.mark.parametrize("rows", [37, 96])  # 37: a partial last tile of B^T
@pytest.mark.parametrize("tokens", [1, 3, 6])
def test_int8_mode_lora_term_is_the_integer_product_of_its_int8_factors(rows, tokens):
    """In the int8 mode, y += u B^T with u[k] = sum over blocks dA * dx * (qA . qx) (A's Q8_0
    codes against x's int8 codes, as any Q8_0 weight) and B^T rounded to halves: against this
    float64 evaluation within float32 rounding, and further from the float32 factors' term."""
    w, (a, b_t), rng = _weight_and_term(rows, 256, 16, seed=rows + tokens)
    x = rng.standard_normal((tokens, 256)).astype(np.float32)
    kern = kernels_native.NativeKernels()
    kern.set_activations("int8")
    with_term = kern.matmul_many(x, [w], [(a, b_t)])[0]
    delta = with_term.astype(np.float64) - kern.matmul_many(x, [w])[0]  # the term alone (as float32 left it)
    a8, bt16 = int8_factors(a, b_t)
    assert a8 is not None and bt16 is not None
    d, _, qa = _int8_codes(T.Q8_0, a8)
    qx, dx = _int8_inputs(x)
    u = (np.einsum("kbi,tbi->tkb", qa, qx) * d[None] * dx[:, None]).sum(-1)  # (T, rank)
    want = u @ untiled(bt16, rows).astype(np.float64)
    scale = np.abs(with_term).max()
    assert np.abs(delta - want).max() <= 1e-5 * scale
    float_term = (x.astype(np.float64) @ a.T) @ b_t
    assert np.abs(delta - float_term).max() > 10 * np.abs(delta - want).max()  # the int8 factors were read


def test_exact_mode_reads_the_float32_factors():
    """The exact mode's term stays (x A^T) B^T in float32 products (within 1e-5 of it), whatever
    copies the int8 mode has made of the same factors."""
    w, (a, b_t), rng = _weight_and_term(96, 256, 16, seed=1)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    kern = kernels_native.NativeKernels()
    kern.set_activations("int8")
    kern.matmul_many(x, [w], [(a, b_t)])  # the int8 copies made and in the descriptors
    kern.set_activations("float32")
    delta = kern.matmul_many(x, [w], [(a, b_t)])[0].astype(np.float64) - kern.matmul_many(x, [w])[0]
    want = (x.astype(np.float64) @ a.T) @ b_t
    assert np.abs(delta - want).max() <= 1e-5 * np.abs(want).max()


def test_int8_factors_fall_back_to_float32_where_they_cannot_hold_the_term():
    """No int8 copies (the float32 factors read in every mode) for an input width that is not a
    multiple of 32, a value that is not finite, or a B^T value beyond a half's range; the
    copies are made once per pair of factors."""
    rng = np.random.default_rng(0)
    a, b_t = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    first = int8_factors(a, b_t)
    assert first[0].shape == (4, 2 * 34) and first[1].shape == (1, 4, BT_TILE) and first[1].dtype == np.float16
    assert untiled(first[1], 8).tobytes() == b_t.astype(np.float16).tobytes()
    assert not first[1][0, :, 8:].any()  # the tile's padding
    assert int8_factors(a, b_t)[0] is first[0]
    assert int8_factors(rng.standard_normal((4, 48)).astype(np.float32), b_t) == (None, None)
    nan_a = a.copy()
    nan_a[1, 3] = np.nan
    assert int8_factors(nan_a, b_t) == (None, None)
    assert int8_factors(a, b_t * np.float32(1e6)) == (None, None)


def test_int8_lora_results_do_not_depend_on_thread_count(tiny_model, store):
    """The int8 mode with LoRA terms on every linear layer: 1 and 2 threads agree bit for bit
    over a prompt and decode steps."""
    from slm.ops.store.importing import import_base
    from slm.ops.infer.loading import load_base_model

    import_base(store, tiny_model["gguf_q"], "tq")
    model = load_base_model(store, "tq").model
    rng = np.random.default_rng(12)
    linear = [n for n, w in model.t.items() if len(w.shape) == 2 and n.startswith("blk.")]
    model.overlays = [random_overlay("lora", model, rng, linear), random_overlay("lora", model, rng, linear, 0.5)]
    model.kernels = kernels_native.NativeKernels()
    modes.use(model.kernels, modes.INT8)
    prompt = rng.integers(0, model.cfg.vocab_size, 7)
    runs = []
    for threads in (1, 2):
        model.kernels.set_threads(threads)
        cache = model.new_cache(16)
        steps = [model.forward(prompt, cache, "all")]
        steps += [model.forward(np.asarray([int(np.argmax(steps[-1][-1]))]), cache) for _ in range(5)]
        runs.append(np.concatenate(steps))
    assert runs[0].tobytes() == runs[1].tobytes()
    assert any(a8 is not None for a8, _ in map(lambda t: int8_factors(*t), _fused_terms(model)))


def _fused_terms(model) -> list:
    return [t for (_, fuses), (t, _) in model._plans.items() if fuses and t is not None]


def test_int8_native_step_with_lora_is_the_op_path_bit_for_bit(monkeypatch):
    """The native decode step and the op-by-op path read the same int8 copies of a composition's
    factors: in the int8 mode their logits agree bit for bit, and the LoRA moves them."""
    from test_step import _compositions, _decode, _model

    from slm.model.step_native import NativeStep

    base = _model("llama", T.Q4_0, 3)
    prompt = np.random.default_rng(3).integers(0, 320, 6)

    def run(models):
        for m in models:
            modes.use(m.kernels, modes.INT8)
        return [_decode(m, prompt, steps=6) for m in models]

    models = _compositions(base, 3)
    assert all(m.native_step() is not None for m in models)
    native = run(models)
    monkeypatch.setattr(NativeStep, "for_model", classmethod(lambda cls, model: None))
    op_path = run(_compositions(base, 3))
    for got, want in zip(native, op_path):
        assert [g.tobytes() for g in got] == [w.tobytes() for w in want]
    assert native[0][-1].tobytes() != native[1][-1].tobytes()
