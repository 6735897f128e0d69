"""What a base importer needs from a checkpoint, whatever its file format."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from slm.formats.jsonfile import canonical_json  # noqa: F401  (importers of a base find it here)


@dataclass
class SourceTensor:
    name: str  # slm (GGUF-style) name
    shape: tuple[int, ...]  # NumPy order
    dtype: str  # codec name of the stored bytes, e.g. "q4_1"
    nbytes: int
    stored_bytes: Callable[[], bytes | memoryview]  # the bytes as they will be stored


@dataclass
class BaseSource:
    format: str  # "gguf" or "hf"
    architecture: dict[str, Any]
    qk_row_layout: str  # see slm.formats.llama.QK_LAYOUTS
    quant_profile: str
    # the tokenizer as canonical JSON (see canonical_json), built when asked: checked when the
    # source is opened, serialised while an import's tensor files are on their way to the disk
    tokenizer_doc: Callable[[], bytes]
    tensors: list[SourceTensor]
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in self.closers:
            close()

