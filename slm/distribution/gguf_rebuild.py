"""A base given back as the GGUF file it was imported from, byte for byte, from the store.

An import of a GGUF file keeps, beside the base, the file's frame (slm.formats.gguf_frame: its
header, metadata and tensor table included, and its size) under names/gguf/<base hex>; every
tensor's bytes are the base's own blobs. The file is rebuilt as: the header, then each tensor's
blob at the offset its header gives, zero padding between them and up to the size. Every blob is
read verified (it hashes to its name), so the result is the file that was imported: the same
sha256.

    write_base_gguf(store, base_digest, out)    write it to `out` (anything with write(bytes))
    iter_base_gguf(store, base_digest)          the same bytes as a stream of chunks
    base_gguf_size(store, base_digest)          its size, without reading a tensor

`slm export BASE --format gguf` and `slm push --as modelpack|docker` (the GGUF layer) use these.
A base imported from Hugging Face weights has no such file: it is converted instead
(slm.distribution.gguf_convert: llama.cpp loads it; not byte-identical to anything, `exact` is
False). A base imported from GGUF but received in a bundle (the frame does not travel) is
refused (Incompatible) with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from slm.compose.base_manifest import BaseManifest, parse_base_manifest
from slm.errors import Incompatible, IntegrityError
from slm.formats.gguf import parse_gguf_header
from slm.formats.gguf_frame import parse_frame_record
from slm.formats.gguf_model import supported_nbytes
from slm.formats.llama import permute_hf_to_gguf
from slm.store import StoreDir
from slm.store import digest as dg

_ZEROS = bytes(1 << 16)


@dataclass(frozen=True)
class GGUFPlan:
    header: bytes
    size: int
    # in file order: (zero bytes before it, the tensor's blob digest, its size, and for a q/k
    # projection whose rows go from Hugging Face's layout to GGUF's (heads, rows), else None)
    tensors: tuple[tuple[int, str, int, tuple[int, int] | None], ...]
    tail: int  # zero bytes after the last tensor
    exact: bool = True  # the file imported, byte for byte (False: converted from HF weights)


def _manifest(store: StoreDir, base: str | BaseManifest, digest: str) -> BaseManifest:
    if isinstance(base, BaseManifest):
        return base
    return parse_base_manifest(store.objects.read_verified(digest), f"base {dg.short(digest)}")


def base_gguf_plan(store: StoreDir, base_digest: str, manifest: BaseManifest | None = None) -> GGUFPlan:
    """Where each of the base's blobs goes in its GGUF file: the file it was imported from, or
    for a base imported from Hugging Face weights a converted one (Incompatible: a GGUF-imported
    base without its frame, or a conversion slm does not do)."""
    short = dg.short(base_digest)
    manifest = _manifest(store, manifest or base_digest, base_digest)
    frame = store.names.get("gguf", dg.hex_of(base_digest))
    if (frame is None or not store.objects.has(frame)) and manifest.source_format == "hf":
        from slm.distribution.gguf_convert import converted_gguf

        header, placed, tail = converted_gguf(store, base_digest, manifest)
        return GGUFPlan(header, len(header) + sum(g + n for g, _, n, _ in placed) + tail, tuple(placed), tail,
                        exact=False)
    if frame is None or not store.objects.has(frame):
        raise Incompatible(f"base {short} has no record of the GGUF file it came from (received in a "
                           "bundle, or imported before slm kept one: import the GGUF file again to "
                           "record it); it cannot be exported as GGUF")
    what = f"the GGUF frame of base {short}"
    header_digest, size = parse_frame_record(store.objects.read_verified(frame), what)
    header = store.objects.read_verified(header_digest)
    parsed = parse_gguf_header(header, size, f"{what}.gguf", supported_nbytes)
    records = manifest.tensor_map
    if {t.name for t in parsed.tensors} != set(records) or len(header) != parsed.data_start:
        raise IntegrityError(f"{what} does not describe the base's tensors (run `slm fsck`)")
    placed, at = [], parsed.data_start
    for t in sorted(parsed.tensors, key=lambda t: t.offset):
        record = records[t.name]
        if t.nbytes != record.nbytes or t.shape != record.shape:
            raise IntegrityError(f"{what}: tensor {t.name} is not the base's (run `slm fsck`)")
        placed.append((t.offset - at, record.digest, record.nbytes, None))
        at = t.offset + t.nbytes
    return GGUFPlan(header, size, tuple(placed), size - at)


def base_gguf_size(store: StoreDir, base_digest: str) -> int:
    return base_gguf_plan(store, base_digest).size


def _zeros(n: int) -> Iterator[bytes]:
    while n > 0:
        yield _ZEROS[:min(n, len(_ZEROS))]
        n -= len(_ZEROS)


def iter_base_gguf(store: StoreDir, base_digest: str, plan: GGUFPlan | None = None) -> Iterator[bytes]:
    """The base's GGUF file in chunks (a tensor's blob is one chunk: read verified, whole)."""
    plan = plan or base_gguf_plan(store, base_digest)
    yield plan.header
    for gap, digest, nbytes, heads in plan.tensors:
        yield from _zeros(gap)
        data = store.objects.read_verified(digest)
        if len(data) != nbytes:
            raise IntegrityError(f"blob {dg.short(digest)} is not {nbytes} bytes (run `slm fsck`)")
        if heads:  # whole rows of the stored type move (a row is a whole number of blocks)
            n_heads, n_rows = heads
            data = permute_hf_to_gguf(np.frombuffer(data, dtype=np.uint8).reshape(n_rows, -1), n_heads).tobytes()
        yield data
    yield from _zeros(plan.tail)


def write_base_gguf(store: StoreDir, base_digest: str, out) -> int:
    """Write the base's GGUF file to `out` (anything with write(bytes) -> int, e.g.
    slm.store.outputs.OutputFile); returns its size."""
    size = 0
    for chunk in iter_base_gguf(store, base_digest):
        out.write(chunk)
        size += len(chunk)
    return size
