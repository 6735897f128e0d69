"""OCI image layouts (image-spec 1.1 "image-layout"): a directory or a tar of one.

    oci-layout            {"imageLayoutVersion": "1.0.0"}
    index.json            {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [<descriptor>]}
    blobs/sha256/<hex>    every blob, named by the sha256 of its bytes

A layout is written into a temporary sibling and renamed into place, so an interrupted export
leaves no half bundle under the requested name. A tar is written with fixed metadata (mtime 0,
uid 0, sorted members): the same composition gives the same bytes. Reading one someone
else wrote is slm.dist.layout_read.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path
from typing import Callable, Iterable

from slm.dist import mediatypes as mt
from slm.dist.bundle import canonical
from slm.errors import InvalidInput, IOFailure, NotFound

# (sha256 digest, size, a function writing the bytes to a binary file)
BlobWriter = tuple[str, int, Callable[[io.RawIOBase], None]]


def _index(manifest_digest: str, manifest_size: int, tag: str) -> bytes:
    return canonical({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": [
        {"mediaType": mt.OCI_MANIFEST, "digest": manifest_digest, "size": manifest_size,
         "annotations": {mt.REF_NAME_ANNOTATION: tag}}]})


def _layout_doc() -> bytes:
    return canonical({"imageLayoutVersion": mt.OCI_LAYOUT_VERSION})


def write_layout(dest: Path, blobs: Iterable[BlobWriter], manifest_digest: str, manifest_size: int,
                 tag: str) -> None:
    """A directory, or a tar when dest ends in .tar. `blobs` includes the manifest itself."""
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise InvalidInput(f"{dest} already exists; choose a new path")
    if not dest.parent.is_dir():
        raise NotFound(f"no such directory: {dest.parent}")
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    try:
        if dest.suffix == ".tar":
            _write_tar(tmp, blobs, _index(manifest_digest, manifest_size, tag))
        else:
            _write_dir(tmp, blobs, _index(manifest_digest, manifest_size, tag))
        os.rename(tmp, dest)
    except OSError as err:
        raise IOFailure(f"cannot write {dest}: {err.strerror or err}") from err
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


def _write_dir(root: Path, blobs: Iterable[BlobWriter], index: bytes) -> None:
    (root / "blobs" / "sha256").mkdir(parents=True)
    (root / "oci-layout").write_bytes(_layout_doc())
    for digest, _, write in blobs:
        with open(root / "blobs" / "sha256" / digest[7:], "wb") as f:
            write(f)
    (root / "index.json").write_bytes(index)


def _member(name: str, size: int, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0, 0, 0, "", ""
    info.mode = 0o755 if directory else 0o644
    if directory:
        info.type, info.size = tarfile.DIRTYPE, 0
    return info


def _write_tar(path: Path, blobs: Iterable[BlobWriter], index: bytes) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_member("oci-layout", len(_layout_doc())), io.BytesIO(_layout_doc()))
        tar.addfile(_member("blobs", 0, True))
        tar.addfile(_member("blobs/sha256", 0, True))
        for digest, size, write in sorted(blobs, key=lambda b: b[0]):
            buf = io.BytesIO()
            write(buf)
            buf.seek(0)
            tar.addfile(_member(f"blobs/sha256/{digest[7:]}", size), buf)
        tar.addfile(_member("index.json", len(index)), io.BytesIO(index))
