"""A ModelPack weight layer packed as a tar (`application/vnd.cncf.model.weight.v1.tar`, as
modctl packs a file): the one regular file it holds, copied out.

The tar is a downloaded layer, already checked against its digest, but written by someone
else: it is read as slm.distribution.layout_read reads a bundle tar (no single read above a
bound, so a header claiming gigabytes is never allocated), and anything but directories and
exactly one regular file (a link, a device, a sparse member, a second file, a member past the
end) is refused with the reason (exit 4).
"""

from __future__ import annotations

import contextlib
import tarfile
from pathlib import Path

from slm.distribution.layout_read import BoundedReads
from slm.errors import IntegrityError, InvalidInput
from slm.formats.untrusted import open_untrusted

MAX_MEMBERS = 1000
PIECE = 1 << 20


def copy_single_file(tar_path: Path, out, where: str) -> str:
    """Write the tar's one regular file to `out` (anything with write(bytes)); its member name."""
    with contextlib.closing(open_untrusted(tar_path, name=where)) as f:
        try:
            with tarfile.open(fileobj=BoundedReads(f), mode="r:") as tar:
                member = _the_file(tar, f.size, where)
                src = tar.extractfile(member)
                left = member.size
                while left > 0:
                    piece = src.read(min(PIECE, left))
                    if not piece:
                        raise IntegrityError(f"{where}: the tar ends inside {member.name!r}")
                    out.write(piece)
                    left -= len(piece)
                return member.name
        except (tarfile.TarError, EOFError) as err:
            raise InvalidInput(f"{where}: not a readable tar ({err})") from err


def _the_file(tar: tarfile.TarFile, total: int, where: str) -> tarfile.TarInfo:
    found = None
    for count, m in enumerate(tar, 1):
        if count > MAX_MEMBERS:
            raise InvalidInput(f"{where}: the tar holds more than {MAX_MEMBERS} members")
        if m.isdir():
            continue
        if not m.isfile() or m.issparse():
            raise InvalidInput(f"{where}: tar member {m.name[:80]!r} is not a regular file (links, devices and "
                               "sparse files are refused)")
        if found is not None:
            raise InvalidInput(f"{where}: the tar holds more than one file ({found.name[:60]!r}, {m.name[:60]!r}); "
                               "slm reads one GGUF file per weight layer")
        if m.offset_data + m.size > total:
            raise InvalidInput(f"{where}: tar member {m.name[:80]!r} claims {m.size} bytes, past the end of the tar")
        found = m
    if found is None:
        raise InvalidInput(f"{where}: the tar holds no file")
    return found
