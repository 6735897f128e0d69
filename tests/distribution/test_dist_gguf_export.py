"""`slm export BASE --format gguf`: a base imported from GGUF comes back as the same file (sha256
equal), through the guarded output path; one imported from Hugging Face weights comes back as a
GGUF llama.cpp runs as slm does; a base with no record of its GGUF file is refused."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from helpers import refused, snapshot, tiny_store


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _export_roundtrip(cli, store_dir, source, out):
    assert cli("--store", store_dir, "init").code == 0
    assert cli("--store", store_dir, "import", "base", source, "--name", "b").code == 0
    before = snapshot(store_dir)
    r = cli("--store", store_dir, "export", "b", "--format", "gguf", "-o", out, "--json")
    assert r.code == 0, r.err
    assert snapshot(store_dir) == before  # an export never changes the store
    return r.json()


def test_tiny_gguf_base_exports_byte_identical(cli, tmp_path, tiny_model):
    store_dir = tmp_path / "store"
    assert cli("--store", store_dir, "init").code == 0
    for key in ("gguf_q", "gguf"):
        out = tmp_path / f"{key}.gguf"
        name = f"b{key.replace('_', '')}"
        assert cli("--store", store_dir, "import", "base", tiny_model[key], "--name", name).code == 0
        r = cli("--store", store_dir, "export", name, "--format", "gguf", "-o", out, "--json")
        assert r.code == 0, r.err
        assert out.read_bytes() == tiny_model[key].read_bytes()
        assert r.json()["sha256"] == _sha256(tiny_model[key])
        assert r.json()["bytes"] == tiny_model[key].stat().st_size


def test_smollm2_base_exports_with_the_source_sha256(cli, tmp_path, smollm2_gguf):
    out = tmp_path / "smol.gguf"
    result = _export_roundtrip(cli, tmp_path / "store", smollm2_gguf, out)
    assert _sha256(out) == _sha256(smollm2_gguf) == result["sha256"]


def test_gemma3_base_exports_with_the_source_sha256(cli, tmp_path, gemma_gguf):
    out = tmp_path / "gemma.gguf"
    result = _export_roundtrip(cli, tmp_path / "store", gemma_gguf, out)
    assert _sha256(out) == _sha256(gemma_gguf) == result["sha256"]


def test_exported_gguf_imports_to_the_same_base_digest(cli, tmp_path, tiny_model):
    store_dir = tiny_store(tmp_path, tiny_model)
    out = tmp_path / "back.gguf"
    assert cli("--store", store_dir, "export", "tq", "--format", "gguf", "-o", out).code == 0
    other = tmp_path / "other"
    assert cli("--store", other, "init").code == 0
    again = cli("--store", other, "import", "base", out, "--name", "again", "--json").json()["digest"]
    original = cli("--store", other, "import", "base", tiny_model["gguf_q"], "--name", "orig", "--json")
    assert again == original.json()["digest"]


def test_received_base_without_its_gguf_frame_is_refused_with_the_reason(cli, tmp_path, tiny_model):
    store_dir = tiny_store(tmp_path, tiny_model)
    assert cli("--store", store_dir, "export", "-o", tmp_path / "b.tar").code == 0
    other = tmp_path / "other"
    assert cli("--store", other, "init").code == 0
    assert cli("--store", other, "import", "bundle", tmp_path / "b.tar").code == 0
    r = refused(cli, other, 6, "export", "tq", "--format", "gguf", "-o", tmp_path / "x.gguf")
    assert "received in a bundle" in r.err
    assert not (tmp_path / "x.gguf").exists()


def test_export_gguf_refuses_an_existing_output_and_the_store(cli, tmp_path, tiny_model):
    store_dir = tiny_store(tmp_path, tiny_model)
    taken = tmp_path / "taken.gguf"
    taken.write_bytes(b"mine")
    refused(cli, store_dir, 4, "export", "tq", "--format", "gguf", "-o", taken)
    assert taken.read_bytes() == b"mine"
    refused(cli, store_dir, 4, "export", "tq", "--format", "gguf", "-o", store_dir / "in.gguf")
    refused(cli, store_dir, 4, "export", "tq", "--format", "gguf", "--base", "tq", "-o", tmp_path / "y.gguf")


def test_frame_survives_gc_while_its_base_is_named(cli, tmp_path, tiny_model):
    store_dir = tiny_store(tmp_path, tiny_model, steps=())
    assert cli("--store", store_dir, "gc").code == 0
    out = tmp_path / "after-gc.gguf"
    assert cli("--store", store_dir, "export", "tq", "--format", "gguf", "-o", out).code == 0
    assert out.read_bytes() == tiny_model["gguf_q"].read_bytes()


IDS = [1, 5, 9, 2, 7, 3, 11, 4]


def _slm_logits(store_dir, base):

    from slm.ops.infer import compositions
    from slm.ops.infer.loading import load_composition
    from slm.store import StoreDir

    store = StoreDir.open(store_dir)
    model = load_composition(store, compositions.build(store, base, [])).model
    return model.forward(np.asarray(IDS), model.new_cache(len(IDS)), "all")


def _llama_cpp_logits(path):

    llama_cpp = pytest.importorskip("llama_cpp")
    ll = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_ubatch=64, logits_all=True, n_threads=1,
                         verbose=False, type_k=0, type_v=0)
    ll.eval(IDS)
    scores = np.array(ll.scores[:len(IDS)], dtype=np.float32)
    ll.close()
    return scores


@pytest.mark.parametrize("quant,tolerance", [("f32", 1e-4), ("q8_0", 0.05)])
def test_hf_imported_base_exports_a_gguf_llama_cpp_runs_as_slm_does(cli, tmp_path, tiny_model, quant, tolerance):
    """No GGUF file to give back: the base is converted (q/k rows into GGUF's layout, tensors in
    their stored type, the tokenizer's BPE tables). On F32 llama.cpp and slm both compute in
    float32 (the gguf-lora export's agreement, docs/distribution.md); Q8_0 llama.cpp also
    quantizes activations to Q8."""

    store_dir = tmp_path / "store"
    assert cli("--store", store_dir, "init").code == 0
    assert cli("--store", store_dir, "import", "base", tiny_model["hf"], "--name", "h", "--quant", quant).code == 0
    out = tmp_path / "h.gguf"
    r = cli("--store", store_dir, "export", "h", "--format", "gguf", "-o", out, "--json")
    assert r.code == 0, r.err
    assert r.json()["exact"] is False and r.json()["sha256"] == _sha256(out)
    ours = _slm_logits(store_dir, "h")
    theirs = _llama_cpp_logits(out)
    print(f"llama.cpp vs slm, tiny HF base {quant} exported to GGUF: {np.abs(theirs - ours).max():.2e}")
    assert np.abs(theirs - ours).max() < tolerance
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()
    # and slm reads it back as a GGUF base that computes the same
    assert cli("--store", store_dir, "import", "base", out, "--name", "back").code == 0
    np.testing.assert_allclose(_slm_logits(store_dir, "back"), ours, atol=1e-4, rtol=0)


def test_fsck_repairs_a_dangling_gguf_frame_by_removing_it(cli, tmp_path, tiny_model):
    from slm.store import StoreDir

    store_dir = tiny_store(tmp_path, tiny_model, steps=())
    store = StoreDir.open(store_dir)
    base = store.names.get("bases", "tq")
    frame = store.names.get("gguf", base[len("blake3:"):])
    assert frame is not None and store.names.get("origins", base[len("blake3:"):]) is not None
    os.chmod(store.objects.path(frame), 0o644)
    os.unlink(store.objects.path(frame))
    r = cli("--store", store_dir, "fsck", "--json")
    assert r.code != 0 and "bad-side-record" in r.out
    assert cli("--store", store_dir, "fsck", "--repair").code == 0
    assert store.names.get("gguf", base[len("blake3:"):]) is None
    assert cli("--store", store_dir, "fsck").code == 0
    r = refused(cli, store_dir, 6, "export", "tq", "--format", "gguf", "-o", tmp_path / "x.gguf")
    assert "import the GGUF file again" in r.err
    # importing the same file again records the frame: the export is exact again
    assert cli("--store", store_dir, "import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("--store", store_dir, "export", "tq", "--format", "gguf", "-o", tmp_path / "y.gguf").code == 0
    assert (tmp_path / "y.gguf").read_bytes() == tiny_model["gguf_q"].read_bytes()
