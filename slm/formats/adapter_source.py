"""What an adapter importer needs from an adapter file, whatever its format.

Every tensor is float32 NumPy, named by the base weight it modifies (slm's GGUF-style names,
e.g. "blk.3.attn_q.weight"), with shapes in NumPy order (out_features, in_features).

    kind "lora":   A (r, in), B (out, r); delta W = scale * B @ A
    kind "ia3":    vector (out,) scaling outputs, or (in,) scaling inputs (feed-forward modules)
    kind "sparse": indices (k,) int64, flat row-major positions in (out, in); values (k,)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

ADAPTER_KINDS = ("lora", "ia3", "sparse")


@dataclass
class AdapterTarget:
    module: str  # base weight name, e.g. "blk.3.attn_q.weight"
    out_features: int
    in_features: int
    # lora: {"A": (r, in), "B": (out, r)}; ia3: {"vector": (out,) or (in,)};
    # sparse: {"indices": (k,) int64, "values": (k,)}
    tensors: dict[str, np.ndarray]
    scale: float = 1.0  # lora: alpha / r (or alpha / sqrt(r) for rsLoRA), per module
    ia3_on: str | None = None  # ia3: "output" or "input"

    @property
    def rank(self) -> int | None:
        return int(self.tensors["A"].shape[0]) if "A" in self.tensors else None


@dataclass
class AdapterSource:
    format: str  # "peft" or "gguf-lora"
    kind: str  # one of ADAPTER_KINDS
    row_layout: str  # q/k output-row layout of the tensors: "hf" (PEFT) or "gguf" (llama.cpp)
    targets: list[AdapterTarget]
    # What it needs of a base: {"family": "llama", "hidden_size": 576, ...} (what is known)
    requires: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # the original config, for provenance
