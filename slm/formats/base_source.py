"""What a base importer needs from a checkpoint, whatever its file format."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from slm.formats.jsonfile import canonical_json  # noqa: F401  (importers of a base find it here)


@dataclass
class SourceTensor:
    name: str  # slm (GGUF-style) name
    shape: tuple[int, ...]  # NumPy order
    dtype: str  # codec name of the stored bytes, e.g. "q4_1"
    nbytes: int
    stored_bytes: Callable[[], bytes | memoryview]  # the bytes as they will be stored
    # a file stored byte for byte (GGUF): the bytes in bounded pieces, each let go of once the
    # next is asked for (argument: the most bytes a piece may have), and where they lie in the
    # open source file, (fd, offset), for a copy that never passes through this process
    pieces: Callable[[int], Iterator[memoryview]] | None = None
    file_range: Callable[[], tuple[int, int]] | None = None


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
    # with `file_range`s: whether the file still holds what was read (True), was written since
    # (False), or cannot be told (None: it changed just before it was opened); see GGUFFile
    unchanged: Callable[[], bool | None] = lambda: True
    # a GGUF file's frame (slm.formats.gguf_frame.GGUFFrame), or None: what else the file holds
    gguf_frame: Callable[[], Any] = lambda: None
    # the Hugging Face Hub repository the weights came from, when the file says so
    hub_id: str | None = None

    def close(self) -> None:
        for close in self.closers:
            close()



_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def hub_id_of(text: str | None) -> str | None:
    """A Hub repository id ("org/name") from what a checkpoint records: the id itself, a
    https://huggingface.co/org/name URL, or a Hub cache path (.../models--org--name/snapshots/..)."""
    if not isinstance(text, str):
        return None
    for part in text.split("/"):
        if part.startswith("models--") and part.count("--") == 2:
            text = part[len("models--"):].replace("--", "/")
            break
    else:
        for prefix in ("https://huggingface.co/", "http://huggingface.co/", "hf://"):
            if text.startswith(prefix):
                text = "/".join(text[len(prefix):].split("/")[:2])
    return text if _HUB_ID.fullmatch(text) and ".." not in text else None
