"""The disk a simulated power cut leaves (slm/store/testing/powercut.py computes it): the image
of a tree of directories and files, its comparison form, how it is written back, and the seeded
choices that tear unsynced data. A test hook, not a user feature."""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 4096
_TEMP_TOKEN = re.compile(r"\.\d+\.[0-9a-f]{12}\.tmp")  # fs.temp_name's pid + random part


@dataclass
class Tree:
    """What stands under the root: directories (uid -> {name: uid}) and files (uid -> data, mode)."""

    dirs: dict[int, dict[str, int]] = field(default_factory=dict)
    files: dict[int, tuple[bytes, int]] = field(default_factory=dict)


@dataclass
class Image:
    """The disk after the cut: directory listings from the root, file contents by uid."""

    root_listing: dict[str, object]  # name -> nested dict (a directory) or a file uid (int)
    files: dict[int, tuple[bytes, int]]

    def flat(self) -> dict[str, bytes | None]:
        """path -> bytes (None for a directory), for comparing two images."""
        out: dict[str, bytes | None] = {}

        def walk(listing: dict, prefix: str) -> None:
            for name, node in sorted(listing.items()):
                path = stable_path(prefix + name)
                if isinstance(node, dict):
                    out[path] = None
                    walk(node, path + "/")
                else:
                    out[path] = self.files[node][0]
        walk(self.root_listing, "")
        return out


def stable_path(path: str) -> str:
    """A path with fs.temp_name's random part removed: the same item in every replay."""
    return _TEMP_TOKEN.sub(".tmp", path)


def write_image(image: Image, root: Path, shared: Path | None = None) -> None:
    """Replace everything under `root` by `image` (hard links kept as links).

    With `shared` (a directory on the same filesystem), read-only files (blobs, mode 0444) are
    hard-linked from one copy per content kept there instead of written again: nothing in the
    store changes a read-only file in place, so cases may share them."""
    for entry in os.scandir(root):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path)
        else:
            path.unlink()
    written: dict[int, Path] = {}

    def build(listing: dict, at: Path) -> None:
        for name, node in sorted(listing.items()):
            path = at / name
            if isinstance(node, dict):
                path.mkdir()
                build(node, path)
            elif node in written:
                os.link(written[node], path)
            else:
                data, mode = image.files[node]
                if shared is not None and mode == 0o444:
                    copy = shared / hashlib.sha256(data).hexdigest()
                    if not copy.exists():
                        copy.write_bytes(data)
                        os.chmod(copy, mode)
                    os.link(copy, path)
                else:
                    path.write_bytes(data)
                    os.chmod(path, mode)
                written[node] = path
    build(image.root_listing, root)


def choice_rng(seed: int, mode: str, kind: str, label: str) -> random.Random:
    return random.Random(f"{seed}|{mode}|{kind}|{label}")


def _garbage(old: bytes, new: bytes, width: int, rng: random.Random) -> bytes:
    """A block whose write was garbled in flight: random bytes wherever the old and the new
    block differ (bytes that were durable and are rewritten unchanged stay: only what the
    kernel had not yet written can be lost)."""
    noise = rng.randbytes(width)
    return bytes(o if i < len(old) and i < len(new) and o == new[i] else noise[i]
                 for i, o in enumerate(old.ljust(width, b"\0")[:width]))


def torn_data(old: bytes, new: bytes, rng: random.Random) -> bytes:
    """Unsynced data torn at block granularity: the size is the old or the new one; each block
    that differs is the old block (zeros past the old end), the new one, or garbage."""
    size = rng.choice((len(old), len(new)))
    out = bytearray()
    for start in range(0, size, BLOCK):
        a, b = old[start:start + BLOCK], new[start:start + BLOCK]
        width = min(BLOCK, size - start)
        if a == b:
            block = a
        else:
            r = rng.random()
            block = a if r < 0.4 else b if r < 0.8 else _garbage(a, b, width, rng)
        out += block[:width].ljust(width, b"\0")
    return bytes(out)
