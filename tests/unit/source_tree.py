"""The slm source tree as the structure tests read it (test_structure.py,
test_structure_public_api.py): where it is, and every module parsed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SLM = ROOT / "slm"


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p)) for p in sorted(SLM.rglob("*.py"))}
