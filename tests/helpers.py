"""Assertion helpers shared by the tests."""

from __future__ import annotations

import hashlib
import shutil
import stat
from pathlib import Path


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file under a store with its mode and content hash (to prove nothing changed)."""
    state = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode):
            state[rel] = ("dir",)
        else:
            state[rel] = (stat.S_IMODE(st.st_mode), hashlib.sha256(path.read_bytes()).hexdigest())
    return state


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def one_line(text: str) -> bool:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return len(lines) == 1 and "Traceback" not in text
