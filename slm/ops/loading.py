"""Loading a runnable model (weights + tokenizer) from the store, read-only."""

from __future__ import annotations

from dataclasses import dataclass

from slm.compose.base_manifest import BaseManifest
from slm.errors import IntegrityError
from slm.model.llama import Config, Llama
from slm.model.tokenizer import TextTokenizer, load_tokenizer
from slm.model.weights import load_tensors
from slm.ops.resolve import load_base
from slm.store import Store
from slm.store import digest as dg


@dataclass
class LoadedBase:
    digest: str
    manifest: BaseManifest
    model: Llama
    tokenizer: TextTokenizer


def verify_blobs(store: Store, digests: list[str]) -> None:
    """Re-hash every blob before use: existence is not proof."""
    for digest in digests:
        if not store.objects.verify(digest):
            raise IntegrityError(
                f"blob {dg.short(digest)} is corrupt: its bytes do not hash to its name (run `slm fsck`)"
            )


def load_base_model(store: Store, ref: str, verify: bool = True) -> LoadedBase:
    digest, manifest = load_base(store, ref)
    if verify:
        verify_blobs(store, manifest.blob_digests())
    tokenizer = load_tokenizer(store.objects.read_verified(manifest.tokenizer_digest))
    tensors = load_tensors(manifest.tensors, store.objects.map)
    cfg = Config.from_architecture(manifest.architecture, manifest.qk_row_layout)
    return LoadedBase(digest, manifest, Llama(cfg, tensors), tokenizer)
