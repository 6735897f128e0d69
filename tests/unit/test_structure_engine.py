"""The generation engine's rules, read from the source (issue 44): slm/engine sits below the
compose layer and the operations (it runs on a Target, knowing nothing of the store), and a
generation request is declared once (slm.engine.request.GenerationRequest): `slm run`'s
options and the server's wire request carry one instead of copying its fields."""

from __future__ import annotations

import ast

from source_tree import _modules

ABOVE_THE_ENGINE = ("slm.compose", "slm.ops", "slm.api", "slm.api_session", "slm.server", "slm.cli",
                    "slm.conversation")


def _imports_from_above(tree: ast.Module) -> list[str]:
    """Every import (top-level or inside a function) of a module above the engine."""
    found = []
    for node in ast.walk(tree):
        modules = ([node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                   else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        found += [f"{node.lineno}: {m}" for m in modules
                  if any(m == up or m.startswith(up + ".") for up in ABOVE_THE_ENGINE)]
        if isinstance(node, ast.ImportFrom) and node.level > 1:
            found.append(f"{node.lineno}: a relative import out of slm/engine")
    return found


def test_the_engine_imports_nothing_above_it():
    engine = {path: tree for path, tree in _modules().items() if path.startswith("slm/engine/")}
    assert {"slm/engine/scheduler.py", "slm/engine/prepare.py", "slm/engine/request.py"} <= set(engine)
    found = {path: lines for path, tree in engine.items() if (lines := _imports_from_above(tree))}
    assert found == {}


def test_the_upward_import_check_catches_each_kind():
    reaches = {"from slm.ops.infer.loading import Loaded": 1, "import slm.compose.memory": 1,
               "def f():\n    from slm.api import Runtime": 1, "from ...ops import run": 1,
               "from slm.engine.request import Tools": 0, "from slm.model import modes": 0,
               "from slm.errors import InvalidInput": 0, "import numpy": 0}
    for source, count in reaches.items():
        assert len(_imports_from_above(ast.parse(source))) == count, source


# The request's option names: a class that declares several of them is a second request type
OPTIONS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "frequency_penalty",
                     "presence_penalty", "repeat_penalty", "logit_bias", "logprobs", "response_format", "tools"})
SECOND_TYPE = 3  # fields in common that make one


def _record_types_declaring_options(tree: ast.Module) -> list[str]:
    """Classes whose body declares fields (`name: type`, a dataclass's, a TypedDict's, a
    NamedTuple's) of SECOND_TYPE or more of the request's option names."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        fields = {item.target.id for item in node.body
                  if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
        if len(fields & OPTIONS) >= SECOND_TYPE:
            found.append(f"{node.name} ({', '.join(sorted(fields & OPTIONS))})")
    return found


def test_the_request_is_declared_once():
    """RunOptions and the server's GenerateRequest once each declared every option again; each
    new option cost five edits. Only GenerationRequest declares them."""
    found = {path: names for path, tree in _modules().items() if (names := _record_types_declaring_options(tree))}
    assert found == {"slm/engine/request.py": [found["slm/engine/request.py"][0]]}
    assert found["slm/engine/request.py"][0].startswith("GenerationRequest (")


def test_the_second_request_check_catches_a_copy():
    copy = "@dataclass\nclass Options:\n    prompt: str\n    temperature: float\n    top_p: float\n    seed: int\n"
    typed = "class Body(TypedDict):\n    max_tokens: int\n    stop: list\n    logprobs: int\n"
    beside = "class Run:\n    request: GenerationRequest\n    threads: int\n    temperature: float\n"
    assert [len(_record_types_declaring_options(ast.parse(s))) for s in (copy, typed, beside)] == [1, 1, 0]
