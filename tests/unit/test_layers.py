"""The floors of the house: every import of slm inside slm/ goes to the importer's own floor
or a floor below it, as docs/architecture.md's layer table states (the table is checked against
FLOORS here, so the page and the rule cannot drift apart). Imports inside functions and under
TYPE_CHECKING count too: a dependency is one whenever it is written."""

from __future__ import annotations

import ast
import re

from source_tree import ROOT, _modules

# Bottom first. A module belongs to the floor of the longest name here that is its own name or
# a package above it ("slm" alone is the package's __init__, the public API's front door).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("slm.errors", "slm.arch", "slm.numbers"),  # beside the bottom: what every floor reads
    ("slm.store",),
    ("slm.quant",),
    ("slm.formats",),
    ("slm.model",),  # the network and its kernels
    ("slm.engine",),  # generation over the network
    ("slm.compose",),
    ("slm.distribution",),
    ("slm.ops",),  # slm/ops/store, slm/ops/ship, slm/ops/infer side by side, and their results
    ("slm", "slm.api", "slm.api_session", "slm.api_names", "slm.api_follow", "slm.api_arguments", "slm.conversation"),
    ("slm.cli", "slm.server", "slm.render", "slm.render_dist", "slm.entry", "slm.__main__"),
)

# (importing file, imported module): why it may reach a floor above its own.
UPWARD_KEPT = {
    ("slm/compose/composition.py", "slm"):
        "a manifest records the runtime that wrote it: slm.__version__, defined by the package's "
        "__init__, which Python has run before any module of the package",
    ("slm/ops/about.py", "slm"): "`slm --version` reports slm.__version__ (as composition.py)",
}


def floor_of(module: str) -> int | None:
    best = None
    for level, names in enumerate(FLOORS):
        for name in names:
            matches = module == name or (name != "slm" and module.startswith(name + "."))
            if matches and (best is None or len(name) > len(best[1])):
                best = (level, name)
    return None if best is None else best[0]


def _module_name(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: str, tree: ast.Module, submodules: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every slm module `path` imports: `from slm import arch` imports the
    submodule slm.arch when there is one (`submodules`), and the package's names otherwise;
    relative imports are resolved against `path`'s package."""
    package = _module_name(path).split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "slm"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "slm":
                continue
            subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in submodules]
            found += [(node.lineno, m) for m in subs]
            if len(subs) < len(node.names):
                found.append((node.lineno, module))
    return found


def upward_imports(modules: dict[str, ast.Module]) -> list[tuple[str, int, str]]:
    """(file, line, module) of each import to a floor above the file's own; a module on no
    floor is reported the same way, as (file, 0, "no floor")."""
    submodules = {_module_name(p) for p in modules}
    found = []
    for path, tree in modules.items():
        own = floor_of(_module_name(path))
        if own is None:
            found.append((path, 0, "no floor"))
            continue
        for line, module in imported_modules(path, tree, submodules):
            target = floor_of(module)
            if target is None or target > own:
                found.append((path, line, module))
    return found


def test_every_import_goes_down_the_floors():
    modules = _modules()
    assert len(modules) >= 150
    found = upward_imports(modules)
    unexplained = [f"{path}:{line} imports {module}" for path, line, module in found
                   if (path, module) not in UPWARD_KEPT]
    assert unexplained == [], "an import climbs a floor (docs/architecture.md, 'The layers')"
    stale = set(UPWARD_KEPT) - {(path, module) for path, _, module in found}
    assert stale == set(), "an exception no longer needed: remove it from UPWARD_KEPT"


def test_the_floor_check_catches_a_planted_upward_import():
    """The checker itself, on a small tree of its own: each way of writing an upward import is
    caught, and imports to the same floor or below pass."""
    sources = {
        "slm/model/decoder.py": "from slm.store import fs\nfrom slm import arch\nfrom slm.model import block\n",
        "slm/model/block.py": "def f():\n    from slm.ops.infer import loading\n",
        "slm/model/batch.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import slm.api\n",
        "slm/model/weights.py": "from ..engine import sampling\n",
        "slm/engine/sampling.py": "from slm import quant\nimport slm\n",
        "slm/store/fs.py": "from slm.errors import InvalidInput\n",
        "slm/arch/__init__.py": "from . import roles\n",
        "slm/arch/roles.py": "",
        "slm/errors.py": "", "slm/api.py": "", "slm/quant/__init__.py": "",
        "slm/ops/infer/loading.py": "from slm.ops.store import specs\nfrom slm.engine import sampling\n",
        "slm/ops/store/specs.py": "from slm.ops.infer import loading\n",
        "slm/newfloor/x.py": "",
    }
    modules = {path: ast.parse(text) for path, text in sources.items()}
    assert sorted(upward_imports(modules)) == [
        ("slm/engine/sampling.py", 2, "slm"),
        ("slm/model/batch.py", 3, "slm.api"),
        ("slm/model/block.py", 2, "slm.ops.infer.loading"),
        ("slm/model/weights.py", 1, "slm.engine.sampling"),
        ("slm/newfloor/x.py", 0, "no floor"),
    ]


def test_the_layer_table_states_the_floors():
    """docs/architecture.md's table, row by row from the top of the page, names the floors of
    FLOORS bottom first (the ones beside the bottom in the sentence above it)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    named = [[ref.removesuffix(".py").replace("/", ".") for ref in re.findall(r"`([\w/.]+)`", cell)] for cell in rows]
    assert [sorted({floor_of(n) for n in row}) for row in named] == [[level] for level in range(1, len(FLOORS))]
    beside = section.split("|", 1)[0]
    assert [name for name in FLOORS[0] if f"`{name}`" not in beside and f"`{name.replace('.', '/')}`" not in beside] == []
