"""The results of import and distribution: import, export, import bundle, push, pull (what
every result shares: slm.ops.results)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slm.ops.results import Result
from slm.ops.results.switches import Transition  # inside Provisioned


@dataclass(frozen=True)
class ImportResult(Result):
    kind: str
    name: str
    digest: str
    source_format: str
    tensors: int
    dtype_counts: dict[str, int]
    total_bytes: int
    new_blobs: int
    new_bytes: int
    seconds: float
    warnings: list[str] = field(default_factory=list)
    previous: str | None = None  # the name pointed here before this import moved it


@dataclass(frozen=True)
class ExportResult(Result):
    """`slm export --format slm`: a composition written as an OCI image layout."""

    format: str
    path: str
    composition_id: str
    manifest_digest: str
    blobs: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class AdapterExportResult(Result):
    """`slm export --format gguf-lora|peft`: one adapter written for another runtime."""

    format: str
    path: str
    adapter: str
    base: str
    weight: float  # the composition's weight for it: give it to the consumer (llama.cpp's lora scale)
    details: dict
    seconds: float


@dataclass(frozen=True)
class BaseExportResult(Result):
    """`slm export BASE --format gguf`: a base written back as the GGUF file it came from."""

    format: str
    path: str
    base: str
    bytes: int
    sha256: str
    exact: bool  # the file the base was imported from (False: converted from Hugging Face weights)
    seconds: float


@dataclass(frozen=True)
class ReceiveResult(Result):
    """`slm import bundle` and `slm pull`: a composition received, every byte re-hashed."""

    composition_id: str
    composition_manifest: str
    base_name: str
    adapter_names: tuple[str, ...]
    signatures: int
    layers: int
    blobs_downloaded: int
    bytes_downloaded: int
    blobs_reused: int
    new_blobs: int
    seconds: float
    source: str = ""
    manifest_digest: str = ""  # sha256 of the OCI manifest received
    referrer_signatures: int = 0  # `slm pull`: signatures found as referrers of it, all checked
    certificates: int = 0  # signed verify certificates it carried
    referrer_certificates: int = 0  # `slm pull`: certificates found as referrers of it, all checked

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "adapter_names": list(self.adapter_names)}


@dataclass(frozen=True)
class PushResult(Result):
    reference: str
    manifest_digest: str
    composition_id: str
    layers: int
    blobs_uploaded: int
    bytes_uploaded: int
    blobs_present: int
    referrers: int  # signature referrers
    seconds: float
    certificate_referrers: int = 0


@dataclass(frozen=True)
class Provisioned(Result):
    """`slm serve --model REF`: the reference pulled (or found pulled) and made active."""

    reference: str
    composition_id: str
    received: ReceiveResult | None  # None: pinned by a digest the store had already received
    transition: Transition  # the activation (changed False when REF was active already)
