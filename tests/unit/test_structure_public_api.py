"""The public API's own rules, read from the source and from slm itself (issue 34): every error
class and every result exported, each public name defined once, every public method annotated,
and `slm serve` built on the public API alone, as the CLI is (tests/unit/test_structure.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import slm
import slm.errors

from source_tree import _modules


def test_every_error_class_is_exported():
    errors = {name for name, value in vars(slm.errors).items()
              if isinstance(value, type) and issubclass(value, slm.errors.SlmError)}
    assert errors and errors <= set(slm.__all__), errors - set(slm.__all__)
    assert "ExitCode" in slm.__all__


# -- the public API's names and result types (issue 34) --------------------------------------------
def _defined_names(tree: ast.Module) -> list[str]:
    """Every class and function defined anywhere in a module (nested ones too), and its
    top-level assignments."""
    names = [n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def test_every_public_name_is_defined_once():
    """A name `import slm` offers (slm.Store, slm.Runtime, slm.Generation...) means one thing in
    the whole tree: an internal class of the same name (slm.store's Store, slm.ops' Runtime,
    slm.model's Generation) made a reader of the code guess which one was meant."""
    where: dict[str, list[str]] = {}
    for path, tree in _modules().items():
        for name in _defined_names(tree):
            where.setdefault(name, []).append(path)
    public = [n for n in slm.__all__ if n != "__version__"]
    assert {n: where.get(n, []) for n in public if len(where.get(n, [])) != 1} == {}


def _api_namespace() -> dict:
    """The globals of slm.api and slm.api_session (Session's module) plus the names they import
    for annotations only (their TYPE_CHECKING blocks), so that every annotation can be evaluated."""
    import slm.api
    import slm.api_session

    ns = {}
    for module in (slm.api_session, slm.api):
        ns.update(vars(module))
        tree = ast.parse(Path(module.__file__).read_text())
        for node in tree.body:
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                exec(compile(ast.Module(node.body, []), module.__file__, "exec"), ns)
    return ns


def _public_api_callables():
    """(qualified name, function) of every public method of slm.api's classes (constructors
    and properties included)."""
    import slm.api

    for cls in (slm.api.Store, slm.api.Runtime, slm.api.Session):
        for name, member in vars(cls).items():
            if name.startswith("_") and name != "__init__":
                continue
            fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if callable(fn):
                yield f"{cls.__name__}.{name}", fn


def _result_classes() -> list[type]:
    from slm.ops import results

    return [v for v in (getattr(results, name) for name in results.__all__)
            if v is not results.Result and issubclass(v, results.Result)]


def _unannotated(fn) -> list[str]:
    import inspect

    sig = inspect.signature(fn)
    missing = [p for i, p in enumerate(sig.parameters)
               if sig.parameters[p].annotation is inspect.Parameter.empty and not (i == 0 and p in ("self", "cls"))]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def test_every_public_api_method_and_result_method_is_annotated():
    """Every parameter and every return of the public API (and of the results it returns) says
    its type, and each annotation names something real: a reader (or an IDE) learns what
    `store.push(...)` gives without reading slm/ops."""
    import typing

    ns = _api_namespace()
    offenders = {}
    functions = list(_public_api_callables())
    assert len(functions) >= 35  # every verb of the Store, the Runtime and the Session
    for cls in _result_classes():
        for name, member in vars(cls).items():
            if name.startswith("__"):
                continue  # what @dataclass generates
            fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if callable(fn):
                functions.append((f"{cls.__name__}.{name}", fn))
    for qualname, fn in functions:
        if missing := _unannotated(fn):
            offenders[qualname] = missing
        else:
            typing.get_type_hints(fn, ns if fn.__module__ in ("slm.api", "slm.api_session") else None)  # the names resolve
    assert offenders == {}


def _classes_in(hint) -> set[type]:
    """The classes a type hint names: Union members, list[...] / tuple[...] arguments."""
    import typing

    args = typing.get_args(hint)
    if args:
        return {c for a in args for c in _classes_in(a)}
    return {hint} if isinstance(hint, type) else set()


def test_every_result_the_api_returns_derives_from_result_and_is_exported():
    """What a public API method returns, and the dataclasses inside it, is a Result (to_json()
    is `--json`'s output) defined in slm.ops.results and exported from slm; once, 8 of the
    documented results (ExportResult, PushResult, SignatureReport...) were not importable
    from slm and each wrote its own to_json. The exceptions are values, not reports of an
    operation: a Composition is passed back to activate/verify, a tokenizer encodes, a Loaded
    (what Runtime.stage staged) is passed to the scheduler, a ToolCall (a Generation's call) is
    passed back in the conversation's next ChatMessage."""
    import dataclasses
    import typing

    from slm.compose.composition import Composition
    from slm.engine.request import ToolCall
    from slm.model.tokenizer import TextTokenizer
    from slm.ops import results
    from slm.ops.infer.loading import Loaded

    values = {Composition, TextTokenizer, Loaded, ToolCall}
    ns = _api_namespace()
    seen: set[type] = set()
    todo = [c for _, fn in _public_api_callables() for c in _classes_in(typing.get_type_hints(fn, ns).get("return"))]
    while todo:
        cls = todo.pop()
        if cls in seen or not dataclasses.is_dataclass(cls) or cls in values:
            continue
        seen.add(cls)
        todo += [c for hint in typing.get_type_hints(cls).values() for c in _classes_in(hint)]
    for cls in seen:
        assert issubclass(cls, results.Result) and cls.__module__.startswith("slm.ops.results."), cls
        assert getattr(results, cls.__name__) is cls, cls
        assert cls.__dataclass_params__.frozen, cls
        assert getattr(slm, cls.__name__) is cls and cls.__name__ in slm.__all__, cls
    assert len(seen) >= 20  # the walk reached every verb's result and the results inside them
    assert set(_result_classes()) | {results.Result} <= {getattr(slm, n) for n in slm.__all__ if n != "__version__"}


def test_results_live_in_one_package():
    """Nothing in slm/ops but slm/ops/results/ defines a class with a to_json(): a new result
    joins the others (derived from Result, exported from slm) instead of growing its own."""
    offenders = []
    for path, tree in _modules().items():
        if not path.startswith("slm/ops/") or path.startswith("slm/ops/results/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(item, ast.FunctionDef) and item.name == "to_json" for item in node.body):
                offenders.append(f"{path}:{node.lineno} {node.name}")
    assert offenders == []


# -- the server on the public API (issue 34) -----------------------------------------------------
def _server_reaches_below_the_api(path: str, tree: ast.Module) -> list[str]:
    """What a slm/server module imports from slm beyond `slm` (its exported names), `slm.api`
    and its own package, and every private attribute it reads on anything but itself."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level > 1 or (node.level == 0 and module.split(".")[0] == "slm" and module not in ("slm", "slm.api")
                                  and module != "slm.server" and not module.startswith("slm.server.")):
                found.append(f"{path}:{node.lineno} from {'.' * node.level}{module} import ...")
            elif module == "slm" and node.level == 0:
                found += [f"{path}:{node.lineno} from slm import {a.name} (not a public name)"
                          for a in node.names if a.name not in slm.__all__]
        elif isinstance(node, ast.Import):
            found += [f"{path}:{node.lineno} import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "slm" and a.name not in ("slm", "slm.api")
                      and not a.name.startswith("slm.server")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(f"{path}:{node.lineno} .{node.attr}")
    return found


def test_the_server_sits_on_the_public_api():
    """`slm serve` reached below the API: its engine imported seven slm.model modules, and
    catalog.py and serve.py read the API Store's private `_s`. Like the CLI, the server imports
    only `slm` (its exported names), `slm.api`, its own package and third-party packages, and
    reads no private attribute of anything but itself."""
    server = {path: tree for path, tree in _modules().items() if path.startswith("slm/server/")}
    assert {"slm/server/app.py", "slm/server/catalog.py", "slm/server/serve.py"} <= set(server)
    offenders = [line for path, tree in server.items() for line in _server_reaches_below_the_api(path, tree)]
    assert offenders == []


def test_the_server_check_catches_a_reach_below_the_api():
    """The check above finds each kind of reach (so its passing means something)."""
    reaches = {
        "from slm.model.batch import decode_step": 1, "import slm.ops.infer.budget": 1, "from slm import errors": 1,
        "from ..ops import budget": 1, "store._s.active_ref": 1, "session._loaded.model": 1,
        "from slm.api import Runtime": 0, "from slm import InvalidInput": 0, "from slm.server.protocol import x": 0,
        "from . import protocol": 0, "self._seen = None": 0, "import numpy": 0,
    }
    for source, count in reaches.items():
        assert len(_server_reaches_below_the_api("x.py", ast.parse(source))) == count, source


# What the server may touch of the engine (issue 44): the Scheduler's public methods and its
# `draining` flag, the typed Handle, events and Status they return; never the scheduler's
# executor, queue or rows, nor a composition's network (its configuration, its kernels).
ENGINE_INTERNALS = frozenset({"preparing", "qsize", "cfg", "kernels"})


def _scheduler_surface() -> frozenset[str]:
    from slm.engine.scheduler import Scheduler

    return frozenset({name for name, value in vars(Scheduler).items() if not name.startswith("_") and callable(value)}
                     | {"draining"})


def _server_reads_engine_internals(path: str, tree: ast.Module, surface: frozenset[str]) -> list[str]:
    """Reads of the engine's insides: an attribute of `scheduler` beyond its surface, an
    unmistakable internal anywhere (an executor, a queue's size, a model's config or kernels),
    and anything read on a `.model` (the network a staged composition runs)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if node.attr in ENGINE_INTERNALS:
            found.append(f"{path}:{node.lineno} .{node.attr}")
        elif isinstance(owner, ast.Name) and owner.id == "scheduler" and node.attr not in surface:
            found.append(f"{path}:{node.lineno} scheduler.{node.attr}")
        elif isinstance(owner, ast.Attribute) and owner.attr == "model":
            found.append(f"{path}:{node.lineno} .model.{node.attr}")
    return found


def test_the_server_reads_only_the_engines_public_typed_surface():
    """The handlers read the scheduler's ThreadPoolExecutor, its queue's qsize(), its running,
    prefilling and awaiting lists and a composition's model.cfg: all public names, so the
    import and `_` checks above let them pass. They use submit_async / call_preparing /
    status() and the Handle's typed events instead."""
    server = {path: tree for path, tree in _modules().items() if path.startswith("slm/server/")}
    surface = _scheduler_surface()
    assert {"submit", "submit_async", "status", "drain"} <= surface and "pending" not in surface
    offenders = [line for path, tree in server.items() for line in _server_reads_engine_internals(path, tree, surface)]
    assert offenders == []


def test_the_engine_surface_check_catches_a_planted_violation():
    surface = _scheduler_surface()
    reaches = {
        "await loop.run_in_executor(scheduler.preparing, parse, body)": 1, "scheduler.pending.qsize()": 2,
        "n = len(scheduler.running) + len(scheduler.awaiting)": 2, "vocab = loaded.model.cfg.vocab_size": 1,
        "loaded.model.t": 1,
        "status = scheduler.status()": 0, "handle = await scheduler.submit_async(target, req)": 0,
        "if scheduler.draining: pass": 0, "event = await handle.next_event()": 0, "req.model or 'active'": 0,
    }
    for source, count in reaches.items():
        assert len(_server_reads_engine_internals("x.py", ast.parse(source), surface)) == count, source


def test_health_never_waits_on_the_engine():
    """/health answers from a plain flag: its handler awaits nothing and reads, of the
    scheduler, only `draining`, an attribute set in Scheduler.__init__ (not a property that
    could take a lock or look at the queue). Its latency under load is measured and printed by
    tests/serve/test_hostile_serve.py, not asserted: this is what keeps it low."""
    import inspect

    from slm.engine.scheduler import Scheduler

    tree = _modules()["slm/server/app.py"]
    health = [n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "health"]
    assert len(health) == 1
    assert not [n for n in ast.walk(health[0]) if isinstance(n, (ast.Await, ast.AsyncFor, ast.AsyncWith))]
    read = {n.attr for n in ast.walk(health[0]) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "scheduler"}
    calls = [n for n in ast.walk(health[0]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "scheduler"]
    assert read == {"draining"} and calls == []
    assert not isinstance(inspect.getattr_static(Scheduler, "draining", None), property)
    init = ast.parse("class S:\n" + inspect.getsource(Scheduler.__init__))  # (a method's source is indented)
    assert any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "draining"
                                                for t in n.targets) for n in ast.walk(init))
