"""A GGUF file's frame: everything in the file that is not a tensor's bytes (the header with its
metadata and tensor table, the padding), kept at import so that the store can give the file
back byte for byte (slm.distribution.gguf_rebuild).

The frame is the file's bytes up to the tensor data (`header`) and the file's size. The bytes
between tensors and after the last one are padding; a file whose padding is all zeros is
rebuilt exactly from the header, the size and the tensors. A file with anything else there
(no known writer does that) has no frame: it is imported as before, and exported to GGUF like a
base imported from another format.
"""

from __future__ import annotations

from dataclasses import dataclass

from slm.errors import InvalidInput
from slm.formats.gguf import GGUFFile
from slm.formats.jsonfile import parse_json_object
from slm.store import digest as dg

SCHEMA = "slm.gguf-frame/1"


@dataclass(frozen=True)
class GGUFFrame:
    header: bytes  # the file's bytes [0, data_start)
    size: int  # the file's size


def frame_of(g: GGUFFile) -> GGUFFrame | None:
    """The frame of an open GGUF file whose tensors all have known sizes, or None if a byte of
    it outside the header and the tensors is not zero."""
    if any(t.nbytes is None for t in g.tensors) or g._map is None:
        return None
    view = memoryview(g._map)
    try:
        at = g.data_start
        for t in sorted(g.tensors, key=lambda t: t.offset):
            if any(view[at:t.offset]):
                return None
            at = t.offset + t.nbytes
        if any(view[at:g.size]):
            return None
        return GGUFFrame(bytes(view[:g.data_start]), g.size)
    finally:
        view.release()


def parse_frame_record(data: bytes, what: str) -> tuple[str, int]:
    """(the header blob's digest, the file's size) from a frame record (canonical JSON:
    {"header": "blake3:..", "schema": SCHEMA, "size": N})."""
    doc = parse_json_object(data, what, 4096)
    header, size = doc.get("header"), doc.get("size")
    if (doc.get("schema") != SCHEMA or set(doc) != {"header", "schema", "size"} or not dg.is_digest(header)
            or not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise InvalidInput(f"{what}: not a {SCHEMA} record")
    return header, size
