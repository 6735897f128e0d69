"""`slm export BASE --format gguf`: a base imported from GGUF comes back as the same file (sha256
equal), through the guarded output path; a base with no record of its GGUF file is refused."""

from __future__ import annotations

import hashlib
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


def test_hf_imported_base_is_refused_with_the_reason(cli, tmp_path, tiny_model):
    store_dir = tiny_store(tmp_path, tiny_model, bases={"hfb": "hf"}, steps=())
    r = refused(cli, store_dir, 6, "export", "hfb", "--format", "gguf", "-o", tmp_path / "x.gguf")
    assert "Hugging Face" in r.err
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
