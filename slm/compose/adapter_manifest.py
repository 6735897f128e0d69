"""The adapter manifest (TOML, schema slm.adapter/1), stored as a blob and named.

    schema = "slm.adapter/1"
    kind = "lora" | "ia3" | "sparse"
    source_format = "peft" | "gguf-lora"
    row_layout = "hf" | "gguf"        # order of q/k output rows in its tensors
    [requires]  family, hidden_size, ... (what is known of a compatible base)
    [[targets]]
    module = "blk.0.attn_q.weight"    # the base weight it modifies
    out_features = 576
    in_features = 576
    scale = 2.0                       # lora: alpha/r or alpha/sqrt(r), patterns resolved
    rank = 16                         # lora only
    ia3_on = "output"                 # ia3 only
    [targets.tensors.A]               # A, B (lora); vector (ia3); indices, values (sparse)
    digest = "blake3:..."
    dtype = "f32"                     # f32 or i64, little-endian, C order
    shape = [16, 576]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slm.compose.toml_io import dumps, field, loads
from slm.errors import InvalidInput
from slm.arch import QK_LAYOUTS
from slm.store import digest as dg

if TYPE_CHECKING:
    import numpy as np

SCHEMA = "slm.adapter/1"
# dtype: (NumPy's name, bytes per value); NumPy itself is imported only to make arrays, not to
# parse or check a manifest (an activation imports no NumPy: slm.ops.infer.compositions.stage)
DTYPES = {"f32": ("<f4", 4), "i64": ("<i8", 8)}
# the tensors of each kind (slm.formats.adapter_source.ADAPTER_KINDS: the same kinds, held equal by
# tests/unit/test_adapters.py; that module is not imported here, as an activation would pay for its classes)
KIND_TENSORS = {"lora": ("A", "B"), "ia3": ("vector",), "sparse": ("indices", "values")}


@dataclass(frozen=True)
class TensorRef:
    digest: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]


@dataclass(frozen=True)
class TargetRecord:
    module: str
    out_features: int
    in_features: int
    scale: float
    tensors: dict[str, TensorRef]
    rank: int | None = None
    ia3_on: str | None = None


@dataclass(frozen=True)
class AdapterManifest:
    kind: str
    source_format: str
    row_layout: str
    requires: dict
    targets: tuple[TargetRecord, ...]

    def blob_digests(self) -> list[str]:
        return [t.digest for target in self.targets for t in target.tensors.values()]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for target in self.targets for t in target.tensors.values())

    @property
    def max_rank(self) -> int | None:
        ranks = [t.rank for t in self.targets if t.rank is not None]
        return max(ranks) if ranks else None

    def to_bytes(self) -> bytes:
        targets = []
        for t in self.targets:
            entry = {"module": t.module, "out_features": t.out_features,
                     "in_features": t.in_features, "scale": t.scale}
            if t.rank is not None:
                entry["rank"] = t.rank
            if t.ia3_on is not None:
                entry["ia3_on"] = t.ia3_on
            entry["tensors"] = {k: {"digest": r.digest, "dtype": r.dtype, "shape": list(r.shape)}
                                for k, r in sorted(t.tensors.items())}
            targets.append(entry)
        return dumps({"schema": SCHEMA, "kind": self.kind, "source_format": self.source_format,
                      "row_layout": self.row_layout, "requires": dict(sorted(self.requires.items())),
                      "targets": targets})


def parse_adapter_manifest(data: bytes, what: str = "adapter manifest") -> AdapterManifest:
    doc = loads(data, what)
    if doc.get("schema") != SCHEMA:
        raise InvalidInput(f"{what}: schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    kind = field(doc, "kind", str, what)
    if kind not in KIND_TENSORS:
        raise InvalidInput(f"{what}: unknown adapter kind {kind!r}")
    layout = field(doc, "row_layout", str, what)
    if layout not in QK_LAYOUTS:
        raise InvalidInput(f"{what}: row_layout {layout!r} is not one of {QK_LAYOUTS}")
    targets = []
    for i, t in enumerate(field(doc, "targets", list, what)):
        where = f"{what} targets[{i}]"
        if not isinstance(t, dict):
            raise InvalidInput(f"{where}: not a table")
        scale = field(t, "scale", (int, float), where)
        if not math.isfinite(scale):
            raise InvalidInput(f"{where}: scale is not finite")
        tensors = {}
        raw = field(t, "tensors", dict, where)
        for key in KIND_TENSORS[kind]:
            ref = field(raw, key, dict, f"{where} tensors")
            digest, dtype = field(ref, "digest", str, where), field(ref, "dtype", str, where)
            shape = tuple(field(ref, "shape", list, where))
            if not dg.is_digest(digest) or dtype not in DTYPES or not all(
                    isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                raise InvalidInput(f"{where}: tensor {key} is malformed")
            tensors[key] = TensorRef(digest, dtype, shape)
        targets.append(TargetRecord(
            module=field(t, "module", str, where),
            out_features=field(t, "out_features", int, where),
            in_features=field(t, "in_features", int, where),
            scale=float(scale),
            tensors=tensors,
            rank=t.get("rank"),
            ia3_on=t.get("ia3_on"),
        ))
    if not targets:
        raise InvalidInput(f"{what}: no targets")
    return AdapterManifest(kind, field(doc, "source_format", str, what), layout,
                           dict(field(doc, "requires", dict, what)), tuple(targets))


def tensor_bytes(arr: np.ndarray) -> tuple[str, bytes]:
    """(dtype name, little-endian C-order bytes) for storing an adapter tensor."""
    import numpy as np

    if np.issubdtype(arr.dtype, np.integer):
        return "i64", np.ascontiguousarray(arr, dtype="<i8").tobytes()
    return "f32", np.ascontiguousarray(arr, dtype="<f4").tobytes()


def check_tensor_bytes(ref: TensorRef, data: bytes) -> bytes:
    """`data`, if it is as many bytes as `ref` says."""
    if len(data) != ref.nbytes:
        raise InvalidInput(f"adapter tensor {dg.short(ref.digest)}: {len(data)} bytes, expected {ref.nbytes}")
    return data


def tensor_from_bytes(ref: TensorRef, data: bytes) -> np.ndarray:
    import numpy as np

    return np.frombuffer(check_tensor_bytes(ref, data), dtype=DTYPES[ref.dtype][0]).reshape(ref.shape)
