"""OCI image layouts (image-spec 1.1 "image-layout"): a directory or a tar of one.

    oci-layout            {"imageLayoutVersion": "1.0.0"}
    index.json            {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [<descriptor>]}
    blobs/sha256/<hex>    every blob, named by the sha256 of its bytes

A layout is written into an output of slm.store.outputs (a temporary sibling renamed into
place), so an interrupted export leaves no half bundle under the requested name. A tar is written with fixed metadata (mtime 0,
uid 0, sorted members): the same composition gives the same bytes. Readers refuse links,
devices and any member outside those three names.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import tarfile
from pathlib import Path
from typing import Callable, Iterable

from slm.dist import mediatypes as mt
from slm.dist.bundle import canonical, is_sha256, parse_descriptor
from slm.errors import IntegrityError, InvalidInput, NotFound

_BLOB = re.compile(r"blobs/sha256/([0-9a-f]{64})")
MAX_INDEX_BYTES = 1 << 20

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


class LayoutReader:
    """Read access to a layout directory or tar: its manifest and blobs by sha256 (unverified
    here: the receiver re-hashes every byte)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.exists():
            raise NotFound(f"no such file or directory: {self.path}")
        self._tar: tarfile.TarFile | None = None
        self._members: dict[str, tarfile.TarInfo] = {}
        if self.path.is_file():
            self._open_tar()
        elif not self.path.is_dir():
            raise InvalidInput(f"{self.path}: not an OCI image layout directory or tar")
        layout = self._small("oci-layout")
        try:
            version = json.loads(layout).get("imageLayoutVersion")
        except (ValueError, AttributeError, UnicodeDecodeError):
            version = None
        if version != mt.OCI_LAYOUT_VERSION:
            raise InvalidInput(f"{self.path}: oci-layout is not imageLayoutVersion {mt.OCI_LAYOUT_VERSION}")

    def _open_tar(self) -> None:
        try:
            self._tar = tarfile.open(self.path, "r:")
            members = self._tar.getmembers()
        except (tarfile.TarError, OSError, EOFError) as err:
            raise InvalidInput(f"{self.path}: not a readable tar ({err})") from err
        for m in members:
            name = m.name.removeprefix("./").rstrip("/")
            if m.isdir() and name in ("", "blobs", "blobs/sha256"):
                continue
            if not m.isfile():
                raise InvalidInput(f"{self.path}: member {m.name!r} is not a regular file (links are refused)")
            if name not in ("oci-layout", "index.json") and not _BLOB.fullmatch(name):
                raise InvalidInput(f"{self.path}: unexpected member {m.name!r} in an OCI image layout")
            if name in self._members:
                raise InvalidInput(f"{self.path}: member {name!r} appears twice")
            self._members[name] = m

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()

    def _small(self, name: str, limit: int = MAX_INDEX_BYTES) -> bytes:
        data = self.read(name, limit)
        if data is None:
            raise InvalidInput(f"{self.path}: no {name} (not an OCI image layout)")
        return data

    def read(self, name: str, limit: int) -> bytes | None:
        """The bytes of a member (None if absent); more than `limit` bytes is refused."""
        if self._tar is not None:
            m = self._members.get(name)
            if m is None:
                return None
            if m.size > limit:
                raise InvalidInput(f"{self.path}: {name} is {m.size} bytes, more than expected ({limit})")
            f = self._tar.extractfile(m)
            return f.read() if f is not None else None
        path = self.path / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise InvalidInput(f"{path}: cannot open ({err.strerror}; links are refused)") from err
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise InvalidInput(f"{path}: not a regular file")
            data = f.read(limit + 1)
        if len(data) > limit:
            raise InvalidInput(f"{path}: more than the {limit} bytes its descriptor says")
        return data

    def manifest_descriptor(self, tag: str | None):
        raw = self._small("index.json")
        try:
            index = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            raise InvalidInput(f"{self.path}: index.json is not JSON") from err
        if not isinstance(index, dict) or index.get("schemaVersion") != 2 or not isinstance(index.get("manifests"), list):
            raise InvalidInput(f"{self.path}: index.json is not an OCI image index")
        unknown = set(index) - {"schemaVersion", "mediaType", "manifests", "annotations"}
        if unknown:
            raise InvalidInput(f"{self.path}: index.json: unknown field {sorted(unknown)[0]!r}")
        entries = []
        for i, raw_desc in enumerate(index["manifests"]):
            desc, notes = parse_descriptor(raw_desc, f"{self.path} index.json manifests[{i}]",
                                           {mt.REF_NAME_ANNOTATION})
            entries.append((desc, notes.get(mt.REF_NAME_ANNOTATION)))
        if tag is not None:
            entries = [e for e in entries if e[1] == tag]
        if len(entries) != 1:
            names = ", ".join(str(e[1]) for e in entries) or "none"
            raise InvalidInput(f"{self.path}: {len(entries)} manifests match (tags: {names}); name one with --tag")
        desc = entries[0][0]
        if desc.media_type != mt.OCI_MANIFEST:
            raise InvalidInput(f"{self.path}: the manifest's mediaType is {desc.media_type!r}, not {mt.OCI_MANIFEST}")
        return desc

    def blob(self, digest: str, size: int) -> bytes:
        """A blob's bytes, at most `size` of them (the receiver checks size and digests)."""
        if not is_sha256(digest):
            raise InvalidInput(f"{self.path}: bad blob digest {digest!r}")
        data = self.read(f"blobs/sha256/{digest[7:]}", max(size, 0))
        if data is None:
            raise IntegrityError(f"{self.path}: blob {digest[:19]} is missing from the bundle")
        return data

