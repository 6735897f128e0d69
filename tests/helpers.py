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


def peak_rss_of(argv: list[str]) -> tuple[int, str]:
    """Run a command in a fresh process; return (its peak RSS in bytes, its stdout)."""
    import subprocess
    import sys

    code = (
        "import resource, subprocess, sys;"
        "r = subprocess.run(sys.argv[1:], check=True, capture_output=True, text=True);"
        "sys.stderr.write(r.stdout);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()), out.stderr
