"""The batched decode step (the server's continuous batching) against single-sequence runs.

slm_matmul_rows (each quantized block unpacked once for all rows, each row with its own LoRA
term) is differential-tested against the float64 reference on every block type the C kernels
have, and each of its rows must be bit for bit the single-row kernel's result. The whole
batched step (slm.model.batch.decode_step) must give every row the logits of that row's own
Decoder.forward, bit for bit, with rows on different compositions (LoRA, IA3, sparse) of one
base.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import random_overlay

from slm.model import kernels_native, modes

pytestmark = pytest.mark.skipif(not kernels_native.available(), reason="C kernels not built")

gguf = pytest.importorskip("gguf")
from test_kernels_kquants import COLS, TYPES, blocks, reference, tensor  # noqa: E402


def _terms(rng, rows: int, out_f: int, in_f: int, tokens: int) -> list:
    """Per row: None, a random low-rank pair (A (r, in), B^T (r, out)), ranks differing, or the
    very pair of the row three before (rows of one composition: the kernel reads their factors
    once for the group)."""
    terms = []
    for t in range(tokens):
        if t % 3 == 2:
            terms.append(None)
            continue
        if t % 3 == 0 and t >= 3:
            terms.append(terms[t - 3])
            continue
        r = 2 + t % 4
        terms.append(((rng.standard_normal((r, in_f)) / np.sqrt(in_f)).astype(np.float32),
                      (rng.standard_normal((r, out_f)) * 0.1).astype(np.float32)))
    return terms


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("tokens", [1, 5, 8, 13])
def test_matmul_rows_matches_reference_and_single_rows(ggml_type, tokens):
    rows = 37
    raws = [blocks(ggml_type, rows, COLS, seed=int(ggml_type) + j) for j in range(2)]
    ws = [tensor(ggml_type, raw) for raw in raws]
    rng = np.random.default_rng([tokens, int(ggml_type)])
    x = rng.standard_normal((tokens, COLS)).astype(np.float32)
    terms = [_terms(rng, rows, rows, COLS, tokens) for _ in ws]
    kern = kernels_native.NativeKernels()
    outs = kern.matmul_rows(x, ws, terms)
    for j, (raw, out) in enumerate(zip(raws, outs)):
        ref, scale = reference(x, ggml_type, raw)
        for t, term in enumerate(terms[j]):
            if term is not None:
                a, b_t = (m.astype(np.float64) for m in term)
                ref[t] += (x[t].astype(np.float64) @ a.T) @ b_t
                scale[t] += np.abs(x[t].astype(np.float64) @ a.T) @ np.abs(b_t)
        assert np.all(np.abs(out - ref) <= 1e-5 * np.maximum(scale, 1e-3)), ggml_type
    for t in range(tokens):  # each row alone through the single-sequence kernel: the same bits
        alone = kern.matmul_many(x[t:t + 1], ws, [terms[j][t] for j in range(len(ws))])
        for j in range(len(ws)):
            assert alone[j][0].tobytes() == outs[j][t].tobytes(), (ggml_type, t, j)


@pytest.mark.parametrize("codec", ["q8_0", "q4_0", "q4_1", "nf4"])
def test_matmul_rows_slm_codecs(codec):
    """The types slm quantizes to itself (NF4 decodes a row, then dots it), against the NumPy
    reference path, and row by row against the single-row kernel."""
    from slm import quant
    from slm.model.kernels import ReferenceKernels
    from slm.model.weights import quant_tensor

    rng = np.random.default_rng(list(codec.encode()))
    w = rng.standard_normal((64, 256)).astype(np.float32) * 0.05
    t = quant_tensor("w", w.shape, codec, quant.get_codec(codec).quantize(w).tobytes())
    x = rng.standard_normal((11, 256)).astype(np.float32)
    kern = kernels_native.NativeKernels()
    out = kern.matmul_rows(x, [t], [[None] * 11])[0]
    ref = ReferenceKernels().matmul(x, t)
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
    for i in range(11):
        assert kern.matmul(x[i:i + 1], t)[0].tobytes() == out[i].tobytes()


@pytest.mark.parametrize("mode", modes.MODES)
def test_decode_step_rows_equal_their_single_runs(mode, tiny_model, store):
    """Eight sequences on six compositions of one base (none; a LoRA; two LoRAs; a LoRA then an
    IA3 output scale; an IA3 input scale on the MLP; a sparse delta; the two-LoRA and the LoRA
    compositions again, sharing their factors with those rows), prompts of different lengths,
    decoded together for 6 greedy steps, rows joining late: every row's logits are bit for bit
    those of its own model decoding alone, in the default mode (int8) and in the exact one."""
    from slm.model.decoder import Decoder
    from slm.ops.store.importing import import_base
    from slm.ops.infer.loading import load_base_model

    import_base(store, tiny_model["gguf_q"], "tq")
    base = load_base_model(store, "tq").model
    rng = np.random.default_rng(5)
    linear = [n for n, w in base.t.items() if len(w.shape) == 2 and n.startswith("blk.")]
    attn = [n for n in linear if "attn" in n]
    down = [n for n in linear if "ffn_down" in n]
    overlays = [[], [random_overlay("lora", base, rng, linear)],
                [random_overlay("lora", base, rng, linear), random_overlay("lora", base, rng, attn, 0.5)],
                [random_overlay("lora", base, rng, attn), random_overlay("ia3", base, rng, [n for n in attn if "attn_v" in n])],
                [random_overlay("ia3", base, rng, down, ia3_on="input")],
                [random_overlay("sparse", base, rng, attn)]]
    models = [Decoder(base.cfg, base.t, overlays=o) for o in overlays]
    models += [models[2], models[1]]
    prompts = [rng.integers(0, base.cfg.vocab_size, n) for n in (3, 7, 1, 12, 5, 9, 4, 2)]
    _check_rows_equal_single_runs(models, prompts, steps=6, mode=mode)


def _check_rows_equal_single_runs(models, prompts, steps: int, mode: str = modes.EXACT) -> None:
    """Row i (models[i] on prompts[i]) joins the batch at step i; each row's logits at every
    step must be bit for bit those of its model decoding alone (the models' kernels and the
    batch's all in `mode`, slm.model.modes)."""
    from slm.model.batch import Row, decode_step

    for m in models:
        modes.use(m.kernels, mode)

    def alone(model, prompt):
        cache = model.new_cache(len(prompt) + steps + 2)
        out = [model.forward(prompt, cache, "last")[-1]]
        for _ in range(steps + 1):
            out.append(model.forward(np.asarray([int(np.argmax(out[-1]))]), cache, "last")[-1])
        return out

    expected = [alone(m, p) for m, p in zip(models, prompts)]
    kern = kernels_native.NativeKernels()
    modes.use(kern, mode)
    caches, last, seen = [], [], []
    for _ in range(len(models) + steps + 2):  # bounded: the last row joins at step len(models) - 1
        if len(caches) < len(models):  # one row joins per step (continuous batching)
            i = len(caches)
            caches.append(models[i].new_cache(len(prompts[i]) + steps + 2))
            last.append(models[i].forward(prompts[i], caches[i], "last")[-1])
            seen.append([last[-1]])
        live = [i for i in range(len(caches)) if len(seen[i]) < steps + 2]
        if not live and len(caches) == len(models):
            break
        rows = [Row(models[i], caches[i], int(np.argmax(last[i]))) for i in live]
        logits = decode_step(rows, kern)
        for k, i in enumerate(live):
            last[i] = logits[k]
            seen[i].append(logits[k])
    assert [len(s) for s in seen] == [steps + 2] * len(models)
    for i, (got, want) in enumerate(zip(seen, expected)):
        for s, (g, w) in enumerate(zip(got, want)):
            assert g.tobytes() == w.tobytes(), f"composition {i}, step {s}: {np.abs(g - w).max()}"


@pytest.mark.oracle  # the fixtures are built with transformers' own classes
@pytest.mark.parametrize("mode", modes.MODES)
@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_decode_step_other_families(arch, mode, tmp_path, store):
    """Gemma 3 (GeGLU, post-norms, sliding windows of 4 crossed by every row, a tied softcapped
    head) and Qwen3 (q/k norms per head): batched rows equal their single runs bit for bit, in
    either mode."""
    import make_tiny_model

    from slm.model.decoder import Decoder
    from slm.ops.store.importing import import_base
    from slm.ops.infer.loading import load_base_model

    fixture = make_tiny_model.make_tiny_model(tmp_path / arch, seed=0, arch=arch)
    import_base(store, fixture["gguf_q"], "m")
    base = load_base_model(store, "m").model
    rng = np.random.default_rng(9)
    linear = [n for n, w in base.t.items() if len(w.shape) == 2 and n.startswith("blk.")]
    models = [base, Decoder(base.cfg, base.t, overlays=[random_overlay("lora", base, rng, linear)]),
              Decoder(base.cfg, base.t, overlays=[random_overlay("ia3", base, rng, [n for n in linear if "attn_v" in n])])]
    prompts = [rng.integers(0, base.cfg.vocab_size, n) for n in (2, 6, 9)]
    _check_rows_equal_single_runs(models, prompts, steps=6, mode=mode)
