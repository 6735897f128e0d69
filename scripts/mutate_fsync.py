#!/usr/bin/env python3
"""Mutation test of the durability protocol: is every fsync needed by some test?

Finds every fsync call site in slm/ by AST (calls of `fsync_dir`, `sync_and_close` and
`_fsync`, and every raw `os.fsync` / `os.fdatasync`: the one in slm/store/fs.py's `_fsync`,
and any other, which would be a write outside the fs layer), then for each one:
copies the project to a scratch directory, replaces that one call by `pass`, and runs the
power-cut tests (tests/durability/test_durability.py, marker `durability`) against the copy. A mutant
is killed when some test fails. Prints killed/total; exits 1 if a mutant survives (an fsync
no test needs: either it is unnecessary, or a case is missing) or if the unmutated tests fail.

Speed: the unmutated run builds the store templates once (SLM_DURABILITY_TEMPLATE) and every
mutant reuses them; mutants run the drop-all cuts first and stop at the first failure
(SLM_DURABILITY_FAIL_FAST); a mutant that drop-all does not kill gets every mode.

    python scripts/mutate_fsync.py            # all call sites
    python scripts/mutate_fsync.py --list     # only list them
    python scripts/mutate_fsync.py --only fs.py:246 --only journal.py
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FSYNC_CALLS = {"fsync_dir", "sync_and_close", "_fsync", "fsync", "fdatasync"}
COPIED = ("slm", "tests", "scripts", "pyproject.toml")


@dataclass(frozen=True)
class Site:
    path: Path  # relative to ROOT
    line: int
    end_line: int
    col: int
    source: str
    function: str  # the enclosing function's qualified name

    @property
    def key(self) -> str:
        """Names the site without its line number (lines move when others edit the file)."""
        return f"{self.path}::{self.function}::{self.source}"

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.function}): {self.source}"


class _Finder(ast.NodeVisitor):
    def __init__(self, path: Path, text: str):
        self.path, self.text, self.scope, self.sites = path, text, [], []

    def _scoped(self, node) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Expr(self, node: ast.Expr) -> None:
        call = node.value
        if isinstance(call, ast.Call):
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in FSYNC_CALLS:
                self.sites.append(Site(self.path, node.lineno, node.end_lineno, node.col_offset,
                                       ast.get_source_segment(self.text, node), ".".join(self.scope)))
        self.generic_visit(node)


def call_sites(root: Path = ROOT) -> list[Site]:
    """Every statement that is a call of one of FSYNC_CALLS, in slm/ (definitions excluded)."""
    sites = []
    for path in sorted((root / "slm").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        finder = _Finder(path.relative_to(root), text)
        finder.visit(ast.parse(text))
        sites += finder.sites
    return sorted(sites, key=lambda s: (str(s.path), s.line))


def mutate(copy: Path, site: Site) -> None:
    """Replace the call statement by `pass` (same indentation, so the block stays valid)."""
    target = copy / site.path
    lines = target.read_text(encoding="utf-8").splitlines(keepends=True)
    first = lines[site.line - 1]
    lines[site.line - 1:site.end_line] = [first[:site.col] + "pass  # mutant: fsync removed\n"]
    target.write_text("".join(lines), encoding="utf-8")


def make_copy(scratch: Path) -> Path:
    copy = scratch / "project"
    if copy.exists():
        shutil.rmtree(copy)
    copy.mkdir(parents=True)
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, copy / name, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        else:
            shutil.copy2(src, copy / name)
    if (ROOT / "fixtures").exists():
        (copy / "fixtures").symlink_to(ROOT / "fixtures")
    return copy


def run_tests(copy: Path, template: Path, modes: str, fail_fast: bool, timeout: float) -> tuple[bool, str]:
    """Run the durability tests inside `copy` (its slm is the one imported). (passed, last lines)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLM_FAULTS", "PYTHONPATH")}
    env.update(PYTHONPATH=os.pathsep.join([str(copy), *filter(None, [os.environ.get("PYTHONPATH")])]),
               SLM_DURABILITY_TEMPLATE=str(template), SLM_DURABILITY_MODES=modes,
               SLM_DURABILITY_FAIL_FAST="1" if fail_fast else "", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "tests/durability/test_durability.py", "-m", "durability", "-q", "-x",
           "-p", "no:cacheprovider", "--no-header", "-o", "addopts="]
    try:
        r = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "timed out"
    out = (r.stdout + r.stderr).strip().splitlines()
    errors = [ln.strip() for ln in out if ln.lstrip().startswith("E ")]
    cuts = [ln for ln in errors if "power cut" in ln]
    why = (cuts or errors or out[-1:] or [""])[0]
    return r.returncode == 0, why[:300]


def check_imports_copy(copy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    r = subprocess.run([sys.executable, "-c", "import slm; print(slm.__file__)"], cwd=copy, env=env,
                       capture_output=True, text=True, check=True)
    if not r.stdout.strip().startswith(str(copy)):
        sys.exit(f"mutate_fsync: the copy's slm is not the one imported ({r.stdout.strip()})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the call sites and exit")
    parser.add_argument("--only", action="append", default=[], metavar="PATTERN",
                        help="only sites whose 'path:line' or 'path::function::call' contains PATTERN "
                             "(repeatable)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per test run")
    args = parser.parse_args(argv)

    sites = [s for s in call_sites()
             if not args.only or any(p in f"{s.path}:{s.line}" or p in s.key for p in args.only)]
    if args.list:
        for site in sites:
            print(f"{site}\n    {site.key}")
        print(f"{len(sites)} fsync call sites")
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="slm-mutate-") as scratch_name:
        scratch = Path(scratch_name)
        template = scratch / "template"
        copy = make_copy(scratch)
        check_imports_copy(copy)
        # the unmutated code passes, and builds the store templates every mutant starts from
        print("unmutated: running the durability tests (drop-all) ...", flush=True)
        ok, last = run_tests(copy, template, "drop-all", False, args.timeout)
        if not ok:
            print(f"unmutated: the durability tests FAIL: {last}")
            return 1
        print(f"unmutated: pass ({time.monotonic() - started:.0f}s)", flush=True)
        survivors = []
        for i, site in enumerate(sites, 1):
            t0 = time.monotonic()
            copy = make_copy(scratch)
            mutate(copy, site)
            ok, last = run_tests(copy, template, "drop-all", True, args.timeout)
            if ok:  # drop-all did not kill it: every mode before calling it a survivor
                ok, last = run_tests(copy, template, "all", True, args.timeout)
            verdict = "SURVIVED" if ok else "killed"
            print(f"[{i}/{len(sites)}] {verdict:8} {site.path}:{site.line} {site.source}  "
                  f"({time.monotonic() - t0:.0f}s)" + ("" if ok else f"\n      by: {last}"), flush=True)
            if ok:
                survivors.append(site)
    killed = len(sites) - len(survivors)
    print(f"\nfsync mutants killed: {killed}/{len(sites)} in {time.monotonic() - started:.0f}s")
    for site in survivors:
        print(f"  survived: {site}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
