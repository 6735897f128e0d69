"""A batch of sequences on several compositions of one base (issue 35, "8 requests on 4
compositions"): the rows of each composition share its LoRA factors inside the batched step
(qkernels/matmul.c's term groups), and every row still gets exactly its own unbatched bits; the
int8 mode's copies of the factors (slm.model.int8_factors) exist only where that mode runs."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from helpers import random_overlay, tiny_store
from test_kernels_kquants import blocks, tensor

from slm.model import kernels_native, modes
from slm.model.int8_factors import copies_of

pytestmark = pytest.mark.skipif(not kernels_native.available(), reason="needs the C kernels")

T = gguf.GGMLQuantizationType
STEPS = 5


def _four_compositions(ggml_type, seed: int):
    """The base alone and three compositions of one plain LoRA each on every linear layer (the
    bench's 8-on-4), each a Decoder over the same base tensors: random weights of ggml_type on
    every linear layer (test_step's model), so that every row can take the native step."""
    from test_step import _model

    from slm.model.decoder import Decoder

    base = _model("llama", ggml_type, seed)
    rng = np.random.default_rng(seed)
    linear = [n for n, w in base.t.items() if len(w.shape) == 2 and n.startswith("blk.")]
    return [Decoder(base.cfg, base.t, overlays=o)
            for o in ([], *([random_overlay("lora", base, rng, linear, weight)] for weight in (1.0, 0.7, 0.4)))]


def _alone(model, prompt, steps: int) -> list[np.ndarray]:
    cache = model.new_cache(len(prompt) + steps + 1)
    out = [model.forward(prompt, cache, "last")[-1]]
    for _ in range(steps):
        out.append(model.forward(np.asarray([int(np.argmax(out[-1]))]), cache, "last")[-1])
    return out


@pytest.mark.parametrize("ggml_type", [T.Q4_1, T.Q4_0, T.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("mode", modes.MODES)
def test_eight_rows_on_four_lora_compositions_equal_each_composition_alone(mode, ggml_type):
    """Eight rows, two on each of four compositions (base, three LoRAs), interleaved as the
    server's batch and bench_scale's 8-on-4 have them, decoded together from their prompts:
    every row's logits at every step are bit for bit its composition's decoding it alone, in
    the default (int8) mode and the exact one, for Q4_1 (the issue's slow case), Q4_0 and Q4_K
    weights; all eight take the one-call native step, and the LoRAs moved their rows off the
    base's logits."""
    from slm.model.batch import Row, decode_step

    four = _four_compositions(ggml_type, seed=35)
    models = [four[i % 4] for i in range(8)]
    for m in four:
        modes.use(m.kernels, mode)
    assert all(m.native_step() is not None for m in four)
    rng = np.random.default_rng(8)
    prompt = rng.integers(0, four[0].cfg.vocab_size, 6)
    prompts = [prompt if i < 4 else rng.integers(0, four[0].cfg.vocab_size, 2 + i) for i in range(8)]
    expected = [_alone(m, p, STEPS) for m, p in zip(models, prompts)]
    assert all(expected[0][0].tobytes() != expected[k][0].tobytes() for k in (1, 2, 3))  # same prompt, moved

    kern = kernels_native.NativeKernels()
    modes.use(kern, mode)
    caches = [m.new_cache(len(p) + STEPS + 1) for m, p in zip(models, prompts)]
    got = [[m.forward(p, c, "last")[-1]] for m, p, c in zip(models, prompts, caches)]
    for _ in range(STEPS):
        logits = decode_step([Row(m, c, int(np.argmax(g[-1]))) for m, c, g in zip(models, caches, got)], kern)
        for g, row in zip(got, logits):
            g.append(row)
    for i, (g_row, e_row) in enumerate(zip(got, expected)):
        for s, (g, e) in enumerate(zip(g_row, e_row)):
            assert g.tobytes() == e.tobytes(), f"row {i} (composition {i % 4}), step {s}: {np.abs(g - e).max()}"


def _factors(loaded) -> list[tuple[np.ndarray, np.ndarray]]:
    """The LoRA factor pairs of a staged composition."""
    return [pair for overlay in loaded.model.overlays for pair in overlay.lora.values()]


def test_int8_factor_copies_are_built_only_in_the_int8_mode(tmp_path, tiny_model):
    """A composition with a LoRA staged and run by an exact-mode Runtime holds no int8 copies of
    its factors, and its memory estimate counts none; the same composition in a default-mode
    Runtime gets copies once it runs (of the factors the fused kernels read: the tiny model's
    MLP; its q, k, v go to the float path with their F16 attn_v), and its estimate counts them."""
    import slm
    from slm.compose.memory import ADAPTER_COPIES, INT8_FACTOR_COPIES

    store = slm.Store.open(tiny_store(tmp_path, tiny_model, adapters=1, steps=()))
    exact = slm.Runtime(store, exact=True)
    loaded = exact.stage("tq+a1")
    assert exact.session("tq+a1").generate("Once upon a time", max_tokens=4).tokens
    pairs = _factors(loaded)
    assert pairs and all(copies_of(a, b_t) is None for a, b_t in pairs)

    default = slm.Runtime(store)
    assert default.mode == modes.INT8
    loaded8 = default.stage("tq+a1")
    assert loaded8.model is not loaded.model  # (its own staging: its own factors)
    assert all(copies_of(a, b_t) is None for a, b_t in _factors(loaded8))  # staging alone builds none
    assert default.session("tq+a1").generate("Once upon a time", max_tokens=4).tokens
    made = [name for overlay in loaded8.model.overlays for name, pair in overlay.lora.items()
            if copies_of(*pair) is not None and copies_of(*pair)[0] is not None]
    assert {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"} <= set(made)
    assert all(copies_of(a, b_t) is None for a, b_t in pairs)  # the exact runtime's still have none

    float_bytes = exact.memory_estimate(loaded)["adapters"] / ADAPTER_COPIES
    assert default.memory_estimate(loaded8)["adapters"] == int((ADAPTER_COPIES + INT8_FACTOR_COPIES) * float_bytes)


@pytest.mark.parametrize("rows", [96, 37])  # whole tiles of B^T's halves; a partial last one
@pytest.mark.parametrize("mode", modes.MODES)
def test_rows_sharing_a_term_in_groups_of_any_size_equal_each_row_alone(mode, rows):
    """One product over 9 rows whose terms come in groups of 1 to 4 rows (the kernel reads a
    group's factors once and, in the int8 mode, adds B^T's halves to two rows at a time, an odd
    row alone): every row's output is bit for bit the single-row product with its own term."""
    rng = np.random.default_rng(rows)
    cols, tokens = 128, 9
    w = tensor(T.Q4_1, blocks(T.Q4_1, rows, cols, seed=rows, adversarial=False))
    pairs = [((rng.standard_normal((r, cols)) / np.sqrt(cols)).astype(np.float32),
              (0.1 * rng.standard_normal((r, rows))).astype(np.float32)) for r in (16, 8, 16)]
    group_of = [0, 1, 0, 2, 1, 0, None, 1, 0]  # groups of 4, 3 and 1 rows, and a row without a term
    terms = [None if g is None else pairs[g] for g in group_of]
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    kern = kernels_native.NativeKernels()
    modes.use(kern, mode)
    out = kern.matmul_rows(x, [w], [terms])[0]
    for t in range(tokens):
        alone = kern.matmul_many(x[t:t + 1], [w], [terms[t]])[0]
        assert alone[0].tobytes() == out[t].tobytes(), t
    assert out[0].tobytes() != kern.matmul_many(x[:1], [w])[0][0].tobytes()  # the term was added
