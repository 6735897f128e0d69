"""Exports of a LoRA on the real SmolLM2-135M-Instruct Q4_1, loaded by their own ecosystems:
the GGUF LoRA by llama.cpp (llama-cpp-python) on the same GGUF base, the PEFT directory by
transformers + PEFT."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import exact

pytestmark = [pytest.mark.real_model, pytest.mark.oracle]

PROMPT = "Once upon a time, in a small village,"
WEIGHT = 0.8


@pytest.fixture(scope="module")
def world(tmp_path_factory, smollm2_gguf):
    import make_random_lora

    from slm.ops.store import activation
    from slm.ops.ship import exporting
    from slm.ops.store.importing import import_adapter, import_base
    from slm.ops.infer.loading import load_base_model
    from slm.store import init_store

    root = tmp_path_factory.mktemp("interop")
    lora = make_random_lora.make_random_lora(root / "lora", rank=8, seed=7, std=0.05)
    store, _ = init_store(root / "store")
    import_base(store, smollm2_gguf, "smollm2")
    import_adapter(store, lora, "demo")
    activation.activate(store, "smollm2", [f"demo@{WEIGHT}"])
    exporting.export(store, None, root / "demo.gguf", "gguf-lora")
    exporting.export(store, None, root / "peft", "peft")
    ids = load_base_model(store, "smollm2").tokenizer.encode(PROMPT)
    return {"store": store, "root": root, "ids": ids, "gguf": smollm2_gguf}


def _slm_logits(store, *adapters):
    from slm.ops.infer import compositions
    from slm.ops.infer.loading import load_composition

    model = exact(load_composition(store, compositions.build(store, "smollm2", list(adapters))).model)
    ids = _slm_logits.ids
    return np.asarray(model.forward(np.asarray(ids), model.new_cache(len(ids)), "all"), np.float32)


@pytest.fixture(autouse=True)
def _ids(world):
    _slm_logits.ids = world["ids"]


def _llama_logits(gguf, ids, lora=None, scale=1.0):
    llama_cpp = pytest.importorskip("llama_cpp")
    kw = {"lora_path": str(lora), "lora_scale": scale} if lora else {}
    ll = llama_cpp.Llama(model_path=str(gguf), n_ctx=128, n_batch=128, n_ubatch=128, logits_all=True,
                         n_threads=2, verbose=False, type_k=0, type_v=0, **kw)
    ll.eval(ids)
    out = np.array(ll.scores[:len(ids)], dtype=np.float32)
    ll.close()
    return out


def test_gguf_lora_export_runs_in_llama_cpp_as_in_slm(world):
    """llama.cpp quantizes activations to Q8 inside its Q4_1 matmuls, so its logits differ from
    slm's (and transformers') on the base already; the exported LoRA must add no more than that,
    and must move llama.cpp's logits as it moves slm's."""
    ids = world["ids"]
    slm_base, slm_lora = _slm_logits(world["store"]), _slm_logits(world["store"], f"demo@{WEIGHT}")
    ll_base = _llama_logits(world["gguf"], ids)
    ll_lora = _llama_logits(world["gguf"], ids, world["root"] / "demo.gguf", WEIGHT)
    base_err, lora_err = np.abs(ll_base - slm_base), np.abs(ll_lora - slm_lora)
    effect = np.abs(slm_lora - slm_base).max()
    delta_err = np.abs((ll_lora - ll_base) - (slm_lora - slm_base)).max()
    top1 = float(np.mean(ll_lora.argmax(-1) == slm_lora.argmax(-1)))
    top1_base = float(np.mean(ll_base.argmax(-1) == slm_base.argmax(-1)))
    print(f"llama.cpp vs slm: base max {base_err.max():.2e} mean {base_err.mean():.2e} top-1 {top1_base:.2f}; "
          f"base + exported LoRA max {lora_err.max():.2e} mean {lora_err.mean():.2e} top-1 {top1:.2f}; "
          f"LoRA effect {effect:.2f}, its error {delta_err:.2e}")
    assert effect > 0.5, "the LoRA changes the logits"
    assert lora_err.max() <= 2.0 * base_err.max() and lora_err.mean() <= 2.0 * base_err.mean()
    assert delta_err < 0.25 * effect  # llama.cpp applies the LoRA slm applies, not another
    # where the argmax differs it is a close call: slm's own gap between the two tokens is
    # within the runtimes' disagreement on the base
    ours_top, theirs_top = slm_lora.argmax(-1), ll_lora.argmax(-1)
    for t in np.flatnonzero(ours_top != theirs_top):
        gap = slm_lora[t, ours_top[t]] - slm_lora[t, theirs_top[t]]
        print(f"  position {t}: top-1 differs, slm's gap {gap:.2f}")
        assert gap <= 2.0 * base_err.max()


def test_peft_export_loads_in_transformers_peft_within_1e_3(world):
    import make_adapters

    ours = _slm_logits(world["store"], "demo@1.0")
    ref = make_adapters.reference_logits(lambda: make_adapters.load_base(world["gguf"]), world["root"] / "peft",
                                         world["ids"])
    diff = np.abs(ours - ref).max()
    print(f"transformers + PEFT on the exported directory vs slm: {diff:.2e}")
    assert diff <= 1e-3
