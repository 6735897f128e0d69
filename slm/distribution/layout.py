"""OCI image layouts (image-spec 1.1 "image-layout"): a directory or a tar of one.

    oci-layout            {"imageLayoutVersion": "1.0.0"}
    index.json            {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [<descriptor>]}
    blobs/sha256/<hex>    every blob, named by the sha256 of its bytes

A layout is written into an output of slm.store.outputs (a temporary sibling renamed into
place), so an interrupted export leaves no half bundle under the requested name. A tar is
written with fixed metadata (mtime 0, uid 0, sorted members): the same composition gives the
same bytes. Reading one someone else wrote is slm.distribution.layout_read.
"""

from __future__ import annotations

import io
import tarfile
from typing import Callable, Iterable

from slm.distribution import mediatypes as mt
from slm.distribution.bundle import canonical

# (sha256 digest, size, a function writing the bytes to a binary file)
BlobWriter = tuple[str, int, Callable[[io.RawIOBase], None]]


def _index(manifest_digest: str, manifest_size: int, tag: str) -> bytes:
    return canonical({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": [
        {"mediaType": mt.OCI_MANIFEST, "digest": manifest_digest, "size": manifest_size,
         "annotations": {mt.REF_NAME_ANNOTATION: tag}}]})


def _layout_doc() -> bytes:
    return canonical({"imageLayoutVersion": mt.OCI_LAYOUT_VERSION})


def write_layout(out, tar: bool, blobs: Iterable[BlobWriter], manifest_digest: str, manifest_size: int,
                 tag: str) -> None:
    """Into `out`: a file output when `tar` (slm.store.outputs.OutputFile), else a directory
    output (OutputDirectory); its caller commits it. `blobs` includes the manifest itself."""
    index = _index(manifest_digest, manifest_size, tag)
    if tar:
        _write_tar(out, blobs, index)
    else:
        _write_dir(out, blobs, index)


def _write_dir(out, blobs: Iterable[BlobWriter], index: bytes) -> None:
    out.subdirectory("blobs")
    out.subdirectory("blobs/sha256")
    out.write_file("oci-layout", lambda f: f.write(_layout_doc()))
    for digest, _, write in blobs:
        out.write_file(f"blobs/sha256/{digest[7:]}", write)
    out.write_file("index.json", lambda f: f.write(index))


def _member(name: str, size: int, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0, 0, 0, "", ""
    info.mode = 0o755 if directory else 0o644
    if directory:
        info.type, info.size = tarfile.DIRTYPE, 0
    return info


def _write_tar(out, blobs: Iterable[BlobWriter], index: bytes) -> None:
    with tarfile.TarFile(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_member("oci-layout", len(_layout_doc())), io.BytesIO(_layout_doc()))
        tar.addfile(_member("blobs", 0, True))
        tar.addfile(_member("blobs/sha256", 0, True))
        for digest, size, write in sorted(blobs, key=lambda b: b[0]):
            buf = io.BytesIO()
            write(buf)
            buf.seek(0)
            tar.addfile(_member(f"blobs/sha256/{digest[7:]}", size), buf)
        tar.addfile(_member("index.json", len(index)), io.BytesIO(index))
