"""The NumPy executor on the tiny synthetic Llama, against transformers on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import exact

from slm.model.kernels import ReferenceKernels
from slm.model.mathops import rope, rope_tables
from slm.model.tokenizer import load_tokenizer
from slm.ops.infer.loading import load_base_model
from slm.ops.store.resolve import load_base
from slm.formats import llama as llama_names
from slm.store import init_store

PROMPT_IDS = [5, 17, 42, 99, 123, 7, 250, 31, 8, 64, 300, 2]


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory, tiny_model):
    from slm.ops.store.importing import import_base

    store, _ = init_store(tmp_path_factory.mktemp("exec") / "store")
    import_base(store, tiny_model["gguf"], "gguf-f32")
    import_base(store, tiny_model["gguf_q"], "gguf-q")
    import_base(store, tiny_model["hf"], "hf-f32", quant="f32")
    import_base(store, tiny_model["hf"], "hf-q8", quant="q8_0")
    return store


def _logits(store, name, ids=PROMPT_IDS):
    model = exact(load_base_model(store, name).model)  # the float32 promise these tests check
    return model.forward(np.asarray(ids), model.new_cache(len(ids)), "all")


def test_gguf_and_hf_row_layouts_give_the_same_logits(tiny_store):
    a = _logits(tiny_store, "gguf-f32")
    b = _logits(tiny_store, "hf-f32")
    assert a.shape == (len(PROMPT_IDS), 400)
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)


def test_incremental_decode_matches_batched_prefill(tiny_store):
    loaded = load_base_model(tiny_store, "gguf-q")
    exact(loaded.model)
    full = loaded.model.forward(np.asarray(PROMPT_IDS), loaded.model.new_cache(len(PROMPT_IDS)), "all")
    cache = loaded.model.new_cache(len(PROMPT_IDS))
    rows = [loaded.model.forward(np.asarray([t]), cache, "last")[0] for t in PROMPT_IDS]
    np.testing.assert_allclose(np.stack(rows), full, atol=2e-5, rtol=0)


def test_chunked_kernel_equals_one_shot(tiny_store):
    loaded = load_base_model(tiny_store, "gguf-q")
    w = loaded.model.t["blk.0.ffn_up.weight"]
    x = np.random.default_rng(0).standard_normal((3, w.cols)).astype(np.float32)
    small = ReferenceKernels(scratch_elems=w.cols * 7)  # forces 7-row chunks
    np.testing.assert_allclose(small.matmul(x, w), x @ w.dequantize().T, rtol=1e-5, atol=1e-6)


def test_rope_layouts_are_the_same_rotation_up_to_row_order():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 2, 16)).astype(np.float32)  # (T, heads, hd), HF layout
    cos, sin = rope_tables(16, 10000.0, np.arange(4))
    hf = rope(x, cos, sin, "hf")
    as_gguf = llama_names.permute_hf_to_gguf(x.transpose(2, 0, 1), 1).transpose(1, 2, 0)
    gg = rope(as_gguf, cos, sin, "gguf")
    back = llama_names.permute_gguf_to_hf(gg.transpose(2, 0, 1), 1).transpose(1, 2, 0)
    np.testing.assert_allclose(back, hf, atol=1e-6)


def test_gguf_tokenizer_matches_tokenizer_json(tiny_store, tiny_model):
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(tiny_model["hf"] / "tokenizer.json"))
    _, manifest = load_base(tiny_store, "gguf-f32")
    ours = load_tokenizer(tiny_store.objects.read_verified(manifest.tokenizer_digest))
    for text in ["Hello world, the cat sat.", "numbers 12345 and  spaces\tand tabs", "naïve café 😀",
                 "<|im_start|>user\nhi<|im_end|>"]:
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False).ids, text
        assert ours.decode(ours.encode(text)) == reference.decode(reference.encode(text).ids)


@pytest.mark.oracle
def test_logits_agree_with_transformers(tiny_store, tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([PROMPT_IDS])
    hf = AutoModelForCausalLM.from_pretrained(tiny_model["hf"], dtype=torch.float32)
    with torch.no_grad():
        ref = hf(ids).logits[0].numpy()
    np.testing.assert_allclose(_logits(tiny_store, "hf-f32"), ref, atol=1e-4, rtol=0)
    np.testing.assert_allclose(_logits(tiny_store, "gguf-f32"), ref, atol=1e-4, rtol=0)

    hq = AutoModelForCausalLM.from_pretrained(tiny_model["outdir"], gguf_file=tiny_model["gguf_q"].name,
                                              dtype=torch.float32)
    with torch.no_grad():
        ref_q = hq(ids).logits[0].numpy()
    np.testing.assert_allclose(_logits(tiny_store, "gguf-q"), ref_q, atol=1e-4, rtol=0)
