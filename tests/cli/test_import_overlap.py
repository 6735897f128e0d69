"""`slm import base` of a GGUF: the work that does not need the disk runs while the tensors'
copies and fsyncs finish, not after them (notes/perf-notes.md, issue 35)."""

from __future__ import annotations

from slm.compose.base_manifest import parse_base_manifest
from slm.formats import gguf_model
from slm.store.objects import Staging


def test_the_tokenizer_is_serialised_before_the_import_waits_for_the_disk(cli, store, store_dir, tiny_model,
                                                                          monkeypatch):
    events: list[str] = []
    built: list[bytes] = []
    builder = gguf_model.tokenizer_builder

    def recording_builder(g):
        build = builder(g)

        def recorded() -> bytes:
            events.append("tokenizer serialised")
            built.append(build())
            return built[-1]
        return recorded

    flush = Staging.flush

    def recording_flush(self) -> None:
        events.append("waited for the copies")
        flush(self)

    monkeypatch.setattr(gguf_model, "tokenizer_builder", recording_builder)
    monkeypatch.setattr(Staging, "flush", recording_flush)
    r = cli("--store", store_dir, "import", "base", tiny_model["gguf_q"], "--name", "tq")
    assert r.code == 0, r.err
    assert events[:2] == ["tokenizer serialised", "waited for the copies"]
    # the tokenizer staged then is the one the manifest names
    manifest = parse_base_manifest(store.objects.read_verified(store.names.get("bases", "tq")))
    assert built and store.objects.read_verified(manifest.tokenizer_digest) == built[0]
