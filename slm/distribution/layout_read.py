"""Reading an OCI image layout someone else wrote (`slm import bundle`): a directory or a tar.

    oci-layout            {"imageLayoutVersion": "1.0.0"}
    index.json            {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [<descriptor>]}
    blobs/sha256/<hex>    every blob, named by the sha256 of its bytes

Nothing else is accepted: a link (blobs/ or blobs/sha256 included), a FIFO, a device, a
directory where a file belongs, a sparse tar member or a stray entry is refused. Every file is
read through slm.formats.untrusted (regular files only, opened non-blocking, sizes known
before reading): a small file (oci-layout, index.json) up to its limit, a blob only if its
size is exactly its descriptor's, and then in chunks (`open_blob`), never whole.

A directory's folders are held open and each member opened relative to them without
following links, so nothing can be swapped for a link between the check and the read. A tar
is read through a file that refuses any single read above a bound: tarfile reads a member's
pax or long-name header whole, and a header claiming gigabytes must not be allocated.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import stat
import tarfile
from pathlib import Path
from slm.distribution import mediatypes as mt
from slm.distribution.bundle import MAX_MANIFEST_BYTES, Descriptor, is_sha256, parse_descriptor
from slm.errors import IntegrityError, InvalidInput, IOFailure, NotFound
from slm.formats.untrusted import UntrustedFile, kind_of, open_untrusted

_HEX = re.compile(r"[0-9a-f]{64}")
_BLOB = re.compile(r"blobs/sha256/([0-9a-f]{64})")
MAX_INDEX_BYTES = 1 << 20
MAX_ENTRIES = 100_000  # blobs in one layout (a layout may hold several images' blobs)
MAX_TAR_READ = 4 << 20  # the largest single read tarfile may make (its headers)


class _TarMember(UntrustedFile):
    """A tar member being read: its size from the tar's header, its bytes through tarfile."""

    def __init__(self, name: str, size: int, member):
        super().__init__(-1, name, size)
        self._member = member

    def read_some(self, n: int) -> bytes:
        try:
            return self._member.read(n)
        except OSError as err:
            raise IOFailure(f"cannot read {self.name}: {err.strerror or err}") from err

    def close(self) -> None:
        self._member.close()


class BoundedReads(io.RawIOBase):
    """A tar file for tarfile: reads above MAX_TAR_READ are refused before anything is allocated."""

    def __init__(self, f: UntrustedFile):
        self.f = f

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return os.lseek(self.f.fd, offset, whence)

    def tell(self) -> int:
        return os.lseek(self.f.fd, 0, os.SEEK_CUR)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > MAX_TAR_READ:
            raise InvalidInput(f"{self.f.name}: a tar header claims more than {MAX_TAR_READ} bytes")
        return self.f.read_some(n)

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)


class LayoutReader:
    """Read access to a layout directory or tar: its manifest descriptor and blobs by sha256
    (unverified here: the receiver re-hashes every byte as it streams it into the store)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._tar: tarfile.TarFile | None = None
        self._tar_file: UntrustedFile | None = None
        self._members: dict[str, tarfile.TarInfo] = {}
        self._fds: list[int] = []
        self._root_fd = self._blobs_fd = -1
        try:
            info = os.stat(self.path)  # the path the user named: a link to it is followed
        except FileNotFoundError:
            raise NotFound(f"no such file or directory: {self.path}") from None
        except OSError as err:
            raise IOFailure(f"cannot access {self.path}: {err.strerror}") from err
        try:
            if stat.S_ISREG(info.st_mode):
                self._open_tar()
            elif stat.S_ISDIR(info.st_mode):
                self._open_dir()
            else:
                raise InvalidInput(f"{self.path} is {kind_of(info.st_mode)}, not an OCI image layout "
                                   "directory or tar")
            layout = self.read_small("oci-layout", MAX_INDEX_BYTES)
            try:
                version = json.loads(layout).get("imageLayoutVersion")
            except (ValueError, AttributeError, UnicodeDecodeError, RecursionError):
                version = None
            if version != mt.OCI_LAYOUT_VERSION:
                raise InvalidInput(f"{self.path}: oci-layout is not imageLayoutVersion {mt.OCI_LAYOUT_VERSION}")
        except BaseException:
            self.close()
            raise

    # -- a directory ------------------------------------------------------------------------
    def _subdir(self, parent: int, name: str, shown: str) -> int:
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            raise InvalidInput(f"{self.path}: no {shown} (not an OCI image layout)") from None
        if not stat.S_ISDIR(mode):
            what = "links are refused" if stat.S_ISLNK(mode) else "not a directory"
            raise InvalidInput(f"{self.path}: {shown} is {kind_of(mode)} ({what})")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link or a file since
                raise InvalidInput(f"{self.path}: {shown} is not a directory (links are refused)") from err
            raise
        self._fds.append(fd)
        return fd

    def _entries(self, fd: int, shown: str) -> list[str]:
        names = []
        with os.scandir(fd) as it:
            for entry in it:
                names.append(entry.name)
                if len(names) > MAX_ENTRIES:
                    raise InvalidInput(f"{self.path}: {shown} holds more than {MAX_ENTRIES} entries")
        return names

    def _open_dir(self) -> None:
        try:
            root = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._fds.append(root)
            self._root_fd = root
            self._stray(self._entries(root, "the layout"), {"oci-layout", "index.json", "blobs"}, "")
            blobs = self._subdir(root, "blobs", "blobs/")
            self._stray(self._entries(blobs, "blobs/"), {"sha256"}, "blobs/")
            self._blobs_fd = self._subdir(blobs, "sha256", "blobs/sha256")
            for name in self._entries(self._blobs_fd, "blobs/sha256"):
                if not _HEX.fullmatch(name):
                    raise InvalidInput(f"{self.path}: unexpected entry blobs/sha256/{name!r} in an OCI image layout")
        except OSError as err:
            raise IOFailure(f"cannot read {self.path}: {err.strerror}") from err

    def _stray(self, names: list[str], allowed: set[str], under: str) -> None:
        stray = sorted(set(names) - allowed)
        if stray:
            raise InvalidInput(f"{self.path}: unexpected entry {under}{stray[0]!r} in an OCI image layout")

    def _open_member(self, name: str) -> UntrustedFile:
        """A member of a layout directory: `name` is oci-layout, index.json or blobs/sha256/<hex>."""
        parent, leaf = (self._blobs_fd, name[len("blobs/sha256/"):]) if name.startswith("blobs/") \
            else (self._root_fd, name)
        return open_untrusted(leaf, dir_fd=parent, name=f"{self.path}/{name}")

    # -- a tar ------------------------------------------------------------------------------
    def _open_tar(self) -> None:
        self._tar_file = open_untrusted(self.path, follow=True)
        total = self._tar_file.size
        try:
            self._tar = tarfile.open(fileobj=BoundedReads(self._tar_file), mode="r:")
            count = 0
            for m in self._tar:
                count += 1
                if count > MAX_ENTRIES:
                    raise InvalidInput(f"{self.path}: more than {MAX_ENTRIES} members")
                self._admit(m, total)
        except (tarfile.TarError, EOFError) as err:
            raise InvalidInput(f"{self.path}: not a readable tar ({err})") from err
        except OSError as err:
            raise IOFailure(f"cannot read {self.path}: {err.strerror or err}") from err
        self._tar.members = []  # the index is ours (self._members); tarfile need not keep a second

    def _admit(self, m: tarfile.TarInfo, total: int) -> None:
        name = m.name.removeprefix("./").rstrip("/")
        if m.isdir() and name in ("", "blobs", "blobs/sha256"):
            return
        if not m.isfile():
            kind = ("a directory" if m.isdir() else "a link" if m.issym() or m.islnk() else "a FIFO" if m.isfifo()
                    else "a device" if m.ischr() or m.isblk() else "of another type")
            blob = _BLOB.fullmatch(name)
            which = f"blob sha256:{blob.group(1)[:12]}: " if blob else ""
            raise InvalidInput(f"{which}{self.path}: member {m.name!r} is {kind}, not a regular file "
                               "(links are refused)")
        if m.issparse():
            raise InvalidInput(f"{self.path}: member {m.name!r} is a sparse file (refused: its size is not "
                               "bytes the tar holds)")
        if name not in ("oci-layout", "index.json") and not _BLOB.fullmatch(name):
            raise InvalidInput(f"{self.path}: unexpected member {m.name!r} in an OCI image layout")
        if name in self._members:
            raise InvalidInput(f"{self.path}: member {name!r} appears twice")
        if m.offset_data + m.size > total:
            raise InvalidInput(f"{self.path}: member {m.name!r} claims {m.size} bytes, past the end of the tar")
        self._members[name] = m

    def _tar_member(self, name: str) -> _TarMember:
        m = self._members.get(name)
        if m is None:
            raise NotFound(f"no such file: {self.path}:{name}")
        return _TarMember(f"{self.path}:{name}", m.size, self._tar.extractfile(m))

    # -- either ------------------------------------------------------------------------------
    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._tar = None
        if self._tar_file is not None:
            self._tar_file.close()
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def open_member(self, name: str):
        """A member (NotFound if absent), its size known before any byte is read; use with
        `contextlib.closing`."""
        if self._tar is not None:
            return self._tar_member(name)
        return self._open_member(name)

    def read_small(self, name: str, limit: int) -> bytes:
        try:
            with contextlib.closing(self.open_member(name)) as f:
                if f.size > limit:
                    raise InvalidInput(f"{f.name} is {f.size} bytes, more than it can be ({limit})")
                data = b"".join(f.chunks(limit))
        except NotFound:
            raise InvalidInput(f"{self.path}: no {name} (not an OCI image layout)") from None
        if len(data) > limit:
            raise InvalidInput(f"{self.path}: {name} grew past {limit} bytes while it was read")
        return data

    def manifest_descriptor(self, tag: str | None) -> Descriptor:
        raw = self.read_small("index.json", MAX_INDEX_BYTES)
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
        tags = ", ".join(str(e[1]) for e in entries) or "none"
        if tag is not None:
            entries = [e for e in entries if e[1] == tag]
            if not entries:
                raise NotFound(f"{self.path}: no manifest tagged {tag!r} (tags: {tags})")
        if not entries:
            raise NotFound(f"{self.path}: index.json lists no manifest")
        if len(entries) > 1:
            raise InvalidInput(f"{self.path}: {len(entries)} manifests match (tags: {tags}); name one with --tag")
        desc = entries[0][0]
        if desc.media_type != mt.OCI_MANIFEST:
            raise InvalidInput(f"{self.path}: the manifest's mediaType is {desc.media_type!r}, not {mt.OCI_MANIFEST}")
        if desc.size > MAX_MANIFEST_BYTES:
            raise InvalidInput(f"{self.path}: the manifest is {desc.size} bytes, more than a manifest can be "
                               f"({MAX_MANIFEST_BYTES})")
        return desc

    def open_blob(self, digest: str, size: int):
        """A blob opened for reading, refused before a byte is read unless it is a regular file
        of exactly `size` bytes (its descriptor's): missing or of another size is exit 5 (the
        bundle does not hold what its manifest says), not a regular file exit 4. Use with
        `contextlib.closing`; its `chunks(size)` give the bytes."""
        if not is_sha256(digest):
            raise InvalidInput(f"{self.path}: bad blob digest {digest!r}")
        name = f"blobs/sha256/{digest[7:]}"
        try:
            f = self.open_member(name)
        except NotFound:
            raise IntegrityError(f"{self.path}: blob {digest[:19]} ({name}) is missing from the bundle") from None
        except InvalidInput as err:
            raise InvalidInput(f"blob {digest[:19]}: {err.message}") from None
        if f.size != size:
            f.close()
            raise IntegrityError(f"{self.path}: blob {digest[:19]} ({name}) is {f.size} bytes, its descriptor "
                                 f"says {size}")
        return f

    def blob(self, digest: str, size: int) -> bytes:
        """A small blob's bytes (a manifest, the config, a signature), its size checked first."""
        with contextlib.closing(self.open_blob(digest, size)) as f:
            return b"".join(f.chunks(size))
