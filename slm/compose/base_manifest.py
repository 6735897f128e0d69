"""The base manifest: what a quantized base is, tensor by tensor (TOML, stored as a blob).

    schema = "slm.base/1"
    source_format = "gguf" | "hf"
    quant_profile = "q4_1"
    qk_row_layout = "gguf" | "hf"     # see slm.arch.QK_LAYOUTS
    [architecture]  family, vocab_size, hidden_size, ... (the family's manifest_fields, slm.arch)
    [tokenizer]     digest, source
    [[tensors]]     name, shape, dtype, nbytes, digest

The manifest holds no time, path or name, so the same checkpoint imported twice gives the
same bytes and so the same digest: the base's identity.
"""

from __future__ import annotations

from dataclasses import dataclass

from slm import arch as archs
from slm.quant.errors import QuantError
from slm.quant.layouts import stored_bytes
from slm.compose.toml_io import dumps, field, loads
from slm.errors import InvalidInput
from slm.formats import llama
from slm.store import digest as dg

SCHEMA = "slm.base/1"


@dataclass(frozen=True)
class TensorRecord:
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    digest: str


@dataclass(frozen=True)
class BaseManifest:
    source_format: str
    quant_profile: str
    qk_row_layout: str
    architecture: dict
    tokenizer_digest: str
    tokenizer_source: str
    tensors: tuple[TensorRecord, ...]

    @property
    def tensor_map(self) -> dict[str, TensorRecord]:
        return {t.name: t for t in self.tensors}

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def dtype_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.dtype] = counts.get(t.dtype, 0) + 1
        return dict(sorted(counts.items()))

    def blob_digests(self) -> list[str]:
        return [self.tokenizer_digest, *(t.digest for t in self.tensors)]

    def to_doc(self) -> dict:
        return {
            "schema": SCHEMA,
            "source_format": self.source_format,
            "quant_profile": self.quant_profile,
            "qk_row_layout": self.qk_row_layout,
            "architecture": {k: self.architecture[k]
                             for k in archs.get(self.architecture["family"]).manifest_fields},
            "tokenizer": {"digest": self.tokenizer_digest, "source": self.tokenizer_source},
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "nbytes": t.nbytes,
                 "digest": t.digest}
                for t in self.tensors
            ],
        }

    def to_bytes(self) -> bytes:
        return dumps(self.to_doc())


def tensor_order(arch: dict) -> dict[str, int]:
    """Canonical tensor order: embedding, final norm, head, then layer by layer."""
    return {name: i for i, name in enumerate(llama.expected_shapes(arch))}


_PARSED: dict[bytes, BaseManifest] = {}  # the last few parses, by exact bytes
_PARSED_MAX = 4


def parse_base_manifest(data: bytes, what: str = "base manifest") -> BaseManifest:
    """The manifest in `data`, validated. An activation reads its base manifest twice (to
    build the composition, then to stage it): the same bytes parse to the same manifest, so
    the last few parses are remembered (a manifest of hundreds of tensors is worth parsing
    once)."""
    data = bytes(data)
    manifest = _PARSED.get(data)
    if manifest is None:
        manifest = _parse(data, what)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[data] = manifest
    return manifest


def _parse(data: bytes, what: str) -> BaseManifest:
    doc = loads(data, what)
    if doc.get("schema") != SCHEMA:
        raise InvalidInput(f"{what}: schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    arch = dict(field(doc, "architecture", dict, what))
    archs.check(arch, what)
    layout = field(doc, "qk_row_layout", str, what)
    if layout not in archs.QK_LAYOUTS:
        raise InvalidInput(f"{what}: qk_row_layout {layout!r} is not one of {archs.QK_LAYOUTS}")
    tok = field(doc, "tokenizer", dict, what)
    tok_digest = field(tok, "digest", str, what + " [tokenizer]")
    if not dg.is_digest(tok_digest):
        raise InvalidInput(f"{what}: tokenizer digest {tok_digest!r} is malformed")
    records = []
    for i, t in enumerate(field(doc, "tensors", list, what)):
        where = f"{what} tensors[{i}]"
        if not isinstance(t, dict):
            raise InvalidInput(f"{where}: not a table")
        shape = tuple(field(t, "shape", list, where))
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise InvalidInput(f"{where}: invalid shape {list(shape)}")
        dtype = field(t, "dtype", str, where)
        try:
            expected_bytes = stored_bytes(dtype, shape)
        except QuantError as err:
            raise InvalidInput(f"{where}: {err}") from err
        nbytes = field(t, "nbytes", int, where)
        if nbytes != expected_bytes:
            raise InvalidInput(f"{where}: nbytes {nbytes} does not match {dtype}{list(shape)}")
        digest = field(t, "digest", str, where)
        if not dg.is_digest(digest):
            raise InvalidInput(f"{where}: digest {digest!r} is malformed")
        records.append(TensorRecord(field(t, "name", str, where), shape, dtype, nbytes, digest))
    llama.check_tensors(arch, {r.name: r.shape for r in records}, what)
    return BaseManifest(
        source_format=field(doc, "source_format", str, what),
        quant_profile=field(doc, "quant_profile", str, what),
        qk_row_layout=layout,
        architecture=arch,
        tokenizer_digest=tok_digest,
        tokenizer_source=field(tok, "source", str, what + " [tokenizer]"),
        tensors=tuple(records),
    )
