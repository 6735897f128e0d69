"""Adapters on the real SmolLM2-135M-Instruct Q4_1 against transformers + PEFT 0.21."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from helpers import exact, one_line, snapshot

pytestmark = [pytest.mark.real_model, pytest.mark.oracle]

PROMPT = "Once upon a time, in a small village,"


@pytest.fixture(scope="module")
def hf_base(smollm2_transformers):
    return smollm2_transformers  # float32 transformers model, loaded once (tests/conftest.py)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, hf_base):
    import make_adapters

    return make_adapters.make_adapters(lambda: hf_base, tmp_path_factory.mktemp("smol-adapters"),
                                       seed=0, rank=16)


@pytest.fixture(scope="module")
def real(tmp_path_factory, smollm2_gguf, adapters):
    from slm.ops.store.importing import import_adapter, import_base
    from slm.store import init_store

    store, _ = init_store(tmp_path_factory.mktemp("real-adapters") / "store")
    import_base(store, smollm2_gguf, "smollm2")
    for name in ("lora", "lora2", "rslora", "ia3", "shira", "lora_gguf"):
        import_adapter(store, adapters[name], name)
    return store


@pytest.fixture(scope="module")
def prompt_ids(real):
    from slm.ops.infer.loading import load_base_model

    return load_base_model(real, "smollm2").tokenizer.encode(PROMPT)


def _logits(store, base, *adapter_specs):
    from slm.ops.infer import compositions
    from slm.ops.infer.loading import load_composition

    model = exact(load_composition(store, compositions.build(store, base, list(adapter_specs))).model)
    ids = _logits.ids
    return model.forward(np.asarray(ids), model.new_cache(len(ids)), "all")


@pytest.fixture(autouse=True)
def _ids(prompt_ids):
    _logits.ids = prompt_ids


@pytest.mark.parametrize("name", ["lora", "ia3", "rslora", "shira"])
def test_prompt_logits_match_peft(real, hf_base, adapters, prompt_ids, name):
    import make_adapters

    ref = make_adapters.reference_logits(lambda: copy.deepcopy(hf_base), adapters[name], prompt_ids)
    ours = _logits(real, "smollm2", name)
    diff = np.abs(ours - ref).max()
    print(f"{name}: max abs logit diff vs transformers+PEFT {diff:.2e}")
    assert diff <= 1e-3
    assert np.abs(ours - _logits(real, "smollm2")).max() > 0.1, "the adapter changes the output"


def test_two_lora_stack_matches_peft(real, hf_base, adapters, prompt_ids):
    import make_adapters

    ref = make_adapters.stacked_reference_logits(
        lambda: copy.deepcopy(hf_base), [(adapters["lora"], 0.7), (adapters["lora2"], 0.3)], prompt_ids)
    diff = np.abs(_logits(real, "smollm2", "lora@0.7", "lora2@0.3") - ref).max()
    print(f"stack 0.7/0.3: max abs logit diff {diff:.2e}")
    assert diff <= 1e-3


def test_gguf_lora_matches_peft_import(real):
    diff = np.abs(_logits(real, "smollm2", "lora_gguf") - _logits(real, "smollm2", "lora")).max()
    print(f"GGUF LoRA vs PEFT import: {diff:.2e}")
    assert diff <= 1e-5


def test_q_k_rows_must_be_permuted(real, hf_base, adapters, prompt_ids, monkeypatch):
    """Applying PEFT's HF-layout rows to the GGUF base unpermuted gives plausible but wrong output."""
    import make_adapters
    from slm.model import overlays

    ref = make_adapters.reference_logits(lambda: copy.deepcopy(hf_base), adapters["lora"], prompt_ids)
    monkeypatch.setattr(overlays, "_row_permutation", lambda n, heads, src, dst: np.arange(n))
    assert np.abs(_logits(real, "smollm2", "lora") - ref).max() > 1e-2


def test_switching_is_bit_exact_through_the_cli(cli, real):
    store = ["--store", real.root]
    blob_names = sorted(p.name for p in (real.root / "objects" / "blake3").iterdir())
    runs = {}
    for label, comp in [("base", []), ("A", ["lora"]), ("base2", []), ("B", ["ia3"]),
                        ("B_direct", ["ia3"])]:
        assert cli(*store, "activate", "smollm2", *comp).code == 0
        runs[label] = cli(*store, "run", PROMPT, "-n", "6", "--json").json()["tokens"]
    assert runs["base"] == runs["base2"]
    assert runs["A"] != runs["base"]
    assert runs["B"] == runs["B_direct"]
    # the log: base, A, base, B (activating B again was a no-op); two steps back was A
    assert [e["op"] for e in cli(*store, "log", "--json").json()] == ["activate"] * 4
    assert cli(*store, "rollback", "-n", "2").code == 0
    assert cli(*store, "run", PROMPT, "-n", "6", "--json").json()["tokens"] == runs["A"]
    after = {p.name for p in (real.root / "objects" / "blake3").iterdir()}
    assert set(blob_names) <= after, "switching only adds composition records; no blob changes"
    assert cli(*store, "fsck").code == 0


def test_adapter_for_another_hidden_size_is_refused(cli, real, tiny_model, tmp_path):
    import make_adapters

    tiny_adapters = make_adapters.make_adapters(tiny_model["hf"], tmp_path / "tiny", seed=1)
    store = ["--store", real.root]
    assert cli(*store, "import", "adapter", tiny_adapters["lora"], "--name", "tiny-lora").code == 0
    before = snapshot(real.root)
    r = cli(*store, "activate", "smollm2", "tiny-lora")
    assert r.code == 6 and one_line(r.err) and "hidden_size" in r.err
    assert snapshot(real.root) == before


def test_base_a_base_logits_are_bit_identical(cli, real, tmp_path):
    store = ["--store", real.root]

    def logits(name):
        path = tmp_path / f"{name}.npy"
        assert cli(*store, "run", PROMPT, "-n", "3", "--logits-out", path).code == 0
        return np.load(path)

    assert cli(*store, "activate", "smollm2").code == 0
    base = logits("base")
    assert cli(*store, "activate", "smollm2", "lora", "shira").code == 0
    adapted = logits("adapted")
    assert cli(*store, "deactivate", "shira").code == 0
    assert cli(*store, "deactivate", "lora").code == 0
    again = logits("again")
    assert not np.array_equal(adapted, base)
    assert np.array_equal(again, base) and again.tobytes() == base.tobytes()


@pytest.mark.parametrize("composition", [[], ["lora"]])
def test_peak_rss_stays_under_the_estimate(real, composition):
    import json
    import subprocess
    import sys

    from helpers import peak_rss_of

    slm = [sys.executable, "-m", "slm", "--store", str(real.root)]
    subprocess.run([*slm, "activate", "smollm2", *composition], check=True, capture_output=True)
    peak, out = peak_rss_of([*slm, "run", PROMPT, "-n", "4", "--json"])
    estimate = json.loads(out)["memory_estimate"]["total"]
    print(f"{composition or 'base'}: peak RSS {peak / 2**20:.0f} MiB, estimate {estimate / 2**20:.0f} MiB")
    assert peak < estimate


@pytest.mark.parametrize("composition", [[], ["lora"], ["ia3"], ["lora@0.7", "lora2@0.3"]])
def test_verify_passes_on_smollm2(cli, real, composition):
    store = ["--store", real.root]
    assert cli(*store, "activate", "smollm2", *composition).code == 0
    r = cli(*store, "verify", "--json")
    assert r.code == 0, r.err
    n = r.json()["numerics"]
    print(f"verify {composition or 'base'}: max abs {n['max_abs_error']:.2e}, mean {n['mean_abs_error']:.2e}, "
          f"top-1 {n['top1_agreement']:.3f}")
    assert n["ok"] and n["top1_agreement"] == 1.0
