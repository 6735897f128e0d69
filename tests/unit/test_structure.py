"""The code's own rules, read from the source (each would have caught a debt issue 13 found):
the CLI only parses and prints, no assert stands in for a check, every store write goes
through slm/store/fs.py, broad excepts re-raise, each shared table is built in one place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import slm
import slm.errors

ROOT = Path(__file__).resolve().parents[2]
SLM = ROOT / "slm"


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p)) for p in sorted(SLM.rglob("*.py"))}


def _functions(tree: ast.Module):
    """(qualified name, node) of every function, methods as Class.method."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def _is_command(fn: ast.FunctionDef) -> bool:
    """Decorated with @app.command(...) or @<sub>_app.command(...)."""
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "command":
            return True
    return False


def test_cli_commands_only_parse_and_print():
    """A command calls the API and prints: it raises nothing of its own, catches nothing, and
    reaches no layer below the API but the run options it fills in."""
    modules = sorted((SLM / "cli").glob("*.py"))
    trees = [ast.parse(path.read_text()) for path in modules]
    commands = [fn for tree in trees for _, fn in _functions(tree) if _is_command(fn)]
    assert len(commands) >= 13
    for fn in commands:
        for node in ast.walk(fn):
            assert not isinstance(node, (ast.Raise, ast.Try)), \
                f"slm/cli {fn.name}: line {node.lineno} decides (raise/try): move it below the API"
    allowed = {"slm", "slm.render", "slm.errors", "slm.api", "slm.store.testing.faults", "slm.ops.run",
               "slm.cli", "slm.cli.common"}
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("slm"):
            names = {a.name for a in node.names}
            beside = node.module.startswith("slm.server.")  # the server sits on the API, as cli does
            assert node.module in allowed or beside or (node.module == "slm.store.testing" and names == {"faults"}), \
                f"slm/cli imports {node.module}: call the API instead"
            if node.module == "slm.ops.run":
                assert {a.name for a in node.names} <= {"RunOptions", "prompt_from_stdin"}


def test_no_assert_stands_in_for_a_check():
    """`python -O` drops asserts: every check in slm/ is an `if ... raise`."""
    found = [f"{path}:{node.lineno}" for path, tree in _modules().items()
             for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    assert found == []


# Calls that write, create or remove files (fs.<name>(...) calls are the fs layer's own).
_WRITES = re.compile(r"\bos\.(unlink|remove|rename|replace|makedirs|mkdir|rmdir|link|chmod|truncate|ftruncate)\("
                     r"|(?<!\bfs)\.(mkdir|write_bytes|write_text|unlink|rmdir|touch)\("
                     r"|\bshutil\.\w+\(|\bnp\.savez?\((?!buf\b)|\bopen\([^)]*[\"'][wax]b?\+?[\"']")
# Files slm writes outside the store, where the user asks, go through slm/store/outputs.py (and so
# through the fs layer too): only --logits-out's np.save into that guarded output is a writing
# call here. And the power-cut simulator (test-only), which plays the kernel rewriting the disk
# after a cut. None: the whole module.
_OUTSIDE_THE_STORE = {"slm/ops/run.py": "class LogitsFile", "slm/store/testing/powercut.py": None,
                      "slm/store/testing/disk_image.py": None}


def test_every_store_write_goes_through_the_fs_layer():
    """The prefix cache made its directories and trimmed its entries beside the fs layer:
    no crash test could reach those writes."""
    offenders = []
    for path in sorted(SLM.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == "slm/store/fs.py":
            continue
        text = path.read_text()
        span = (0, 0)
        if _OUTSIDE_THE_STORE.get(rel, "") is None:
            continue
        if rel in _OUTSIDE_THE_STORE:
            start = text.index(_OUTSIDE_THE_STORE[rel])
            span = (start, text.index("\ndef ", start))
        for m in _WRITES.finditer(text):
            if not span[0] <= m.start() < span[1]:
                line = text.count("\n", 0, m.start()) + 1
                offenders.append(f"{rel}:{line}: {text.splitlines()[line - 1].strip()}")
    assert offenders == []


# Handlers of Exception / BaseException / everything that may end without re-raising, and why.
_BROAD_KEPT = {
    ("slm/cli/__init__.py", "run"): "the top level: an unexpected exception is a bug, reported in one line (exit 1)",
    ("slm/api_session.py", "Session.stream"): "the worker thread hands the exception to the consumer, which raises it",
    ("slm/conversation.py", "Conversation.ask"): "the answer's worker thread hands the exception to the asker, "
                                                 "which raises it",
    ("slm/server/catalog.py", "Catalog._watch"): "the refs/active watcher logs a failed look and keeps watching",
    ("slm/ops/scheduler.py", "Scheduler._loop"):
        "a failed batch step fails its requests (HTTP 500) and the server goes on",
    ("slm/ops/scheduler.py", "Scheduler._guarded"):
        "a failed prefill (or chunk) fails its request (HTTP 500) and the server goes on",
}


def test_broad_excepts_re_raise():
    """`except Exception` hid real faults (prefix cache, ls, journal): a broad handler must
    re-raise (clean-up, or a narrowing test inside), unless listed above with its reason."""
    offenders = []
    for path, tree in _modules().items():
        for name, fn in _functions(tree):
            for node in ast.walk(fn):
                if not isinstance(node, ast.ExceptHandler):
                    continue
                broad = node.type is None or (isinstance(node.type, ast.Name) and
                                              node.type.id in ("Exception", "BaseException"))
                if not broad or (path, name) in _BROAD_KEPT:
                    continue
                if not any(isinstance(n, ast.Raise) for n in ast.walk(node)):
                    offenders.append(f"{path}:{node.lineno} ({name})")
    assert offenders == []


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
    (what Runtime.stage staged) is passed to the scheduler."""
    import dataclasses
    import typing

    from slm.compose.composition import Composition
    from slm.model.tokenizer import TextTokenizer
    from slm.ops import results
    from slm.ops.loading import Loaded

    values = {Composition, TextTokenizer, Loaded}
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


def _occurrences(pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return [f"{p.relative_to(ROOT)}:{p.read_text().count(chr(10), 0, m.start()) + 1}"
            for p in sorted(SLM.rglob("*.py")) for m in rx.finditer(p.read_text())]


def test_the_heads_table_is_built_in_one_place():
    """{"attn_q": num_heads, "attn_k": num_kv_heads}: slm.arch.roles.qk_heads, nowhere else."""
    found = _occurrences(r"[\"']attn_k[\"']\s*:\s*[^,}\n]*num_kv_heads")
    assert len(found) == 1 and found[0].startswith("slm/arch/roles.py"), found


def test_the_adapter_list_is_built_in_one_place():
    """A composition's adapters as a list of {name, digest, load_order, weight}: one builder
    (Composition.adapter_list) for the manifest and `slm show`."""
    found = _occurrences(r"[\"']load_order[\"']\s*:\s*i\s*\+\s*1\s*,\s*[\"']weight[\"']\s*:\s*a\.weight")
    assert len(found) == 1 and found[0].startswith("slm/compose/composition.py"), found


def test_role_tables_live_in_one_module():
    """The linear-role table (role -> (out, in) dimensions) is defined once and imported by
    both adapter readers."""
    found = _occurrences(r"[\"']attn_output[\"']\s*:\s*\(\s*[\"']H[\"']")
    assert found and all(f.startswith("slm/arch/roles.py") for f in found), found
    for reader in ("slm/formats/gguf_lora.py", "slm/formats/peft/tensors.py", "slm/formats/peft/dims.py"):
        assert "from slm.arch.roles import" in (ROOT / reader).read_text(), reader


# issue 34: no source file over 450 lines, the C kernels included.
MAX_LINES = 450


def test_no_source_file_over_450_lines():
    sources = [p for p in sorted(SLM.rglob("*")) if p.suffix in {".py", ".c", ".h"}]
    assert {".py", ".c", ".h"} <= {p.suffix for p in sources}  # the C sources are among them
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in sources}
    too_long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert not too_long, f"over {MAX_LINES} lines (split by concern): {too_long}"


KERNELS = SLM / "model" / "qkernels"


def test_every_kernel_source_is_built_headed_and_mapped():
    """_qkernels.c (the unity build setup.py compiles) includes every kernel source; each opens
    with a header comment naming itself, and docs/kernels.md's map names it."""
    unity = (SLM / "model" / "_qkernels.c").read_text()
    included = re.findall(r'^#include "qkernels/([\w.]+)"$', unity, re.M)
    sources = sorted(p.name for p in KERNELS.iterdir() if p.suffix in {".c", ".h"})
    assert sources and sorted(included) == sources
    kernel_map = (ROOT / "docs" / "kernels.md").read_text()
    for name in sources:
        assert (KERNELS / name).read_text().startswith(f"/* qkernels/{name}: "), name
        assert f"`qkernels/{name}`" in kernel_map, name


_TRANSACTION = "slm/store/transaction.py"
_TRANSACTIONS = ("slm/ops/activation.py", "slm/ops/importing.py", "slm/ops/receive.py", "slm/ops/signing.py",
                 "slm/ops/gc.py")


def _journal_protocol_uses(tree: ast.Module) -> list[int]:
    """Lines that begin or end a journal intent (`<...>journal.begin/end(...)`) or name
    CommittedIncomplete (raising it, importing it)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("begin", "end"):
            owner = node.func.value
            owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if owner_name == "journal":
                lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id == "CommittedIncomplete":
            lines.append(node.lineno)
        elif isinstance(node, ast.alias) and node.name == "CommittedIncomplete":
            lines.append(node.lineno)
    return lines


def test_the_journal_protocol_is_implemented_once():
    """Activation, import, receive, signing and gc each wrote the intent, the commit point, the
    undo and the CommittedIncomplete by hand: one transaction object (slm.store.transaction)
    owns them, and every one of the five opens it."""
    found = {path: lines for path, tree in _modules().items() if (lines := _journal_protocol_uses(tree))}
    assert set(found) == {_TRANSACTION}, {p: l for p, l in found.items() if p != _TRANSACTION}
    for path in _TRANSACTIONS:
        assert ".transaction(" in (ROOT / path).read_text(), f"{path} does not open a store transaction"


def test_the_test_hooks_live_outside_the_store_main_modules():
    """The power-cut simulator and the fault plans are test hooks: they live in
    slm/store/testing/ (the fs layer keeps only its two hook variables); only the CLI, which
    reads SLM_FAULTS, imports them; and no file of theirs is over 450 lines."""
    store_modules = {p.name for p in (SLM / "store").glob("*.py")}
    assert not store_modules & {"powercut.py", "faults.py", "disk_image.py"}, store_modules
    importers = set()
    for path, tree in _modules().items():
        if path.startswith("slm/store/testing/"):
            continue
        for node in ast.walk(tree):
            modules = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                       else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(m == "slm.store.testing" or m.startswith("slm.store.testing.") for m in modules):
                importers.add(path)
    assert importers == {"slm/cli/__init__.py"}, importers
    long = {p.name: n for p in (SLM / "store" / "testing").glob("*.py")
            if (n := p.read_text().count("\n")) > 450}
    assert long == {}


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
        "from slm.model.batch import decode_step": 1, "import slm.ops.budget": 1, "from slm import errors": 1,
        "from ..ops import budget": 1, "store._s.active_ref": 1, "session._loaded.model": 1,
        "from slm.api import Runtime": 0, "from slm import InvalidInput": 0, "from slm.server.protocol import x": 0,
        "from . import protocol": 0, "self._seen = None": 0, "import numpy": 0,
    }
    for source, count in reaches.items():
        assert len(_server_reaches_below_the_api("x.py", ast.parse(source))) == count, source


# issue 34: one module decides why a generation stops, one validates the sampling options.
STOP_REASONS = {"eos", "length", "context", "switched", "cancelled"}


def _decided_stop_reasons(tree: ast.Module) -> list[int]:
    """Lines where a stop-reason literal is given as a value: assigned, returned, passed to a
    call (alone or in an event tuple), a field's default. A dict key, a comparison or a
    subscript only reads one."""
    def literal(node) -> bool:
        return isinstance(node, ast.Constant) and node.value in STOP_REASONS

    lines = []
    for node in ast.walk(tree):
        values = []
        if isinstance(node, (ast.Return, ast.Assign, ast.AnnAssign)) and node.value is not None:
            values = [node.value]
        elif isinstance(node, ast.Call):
            values = [*node.args, *(k.value for k in node.keywords)]
        for value in values:
            parts = value.elts if isinstance(value, ast.Tuple) else [value]
            lines += [part.lineno for part in parts if literal(part)]
    return lines


def test_stop_reasons_are_decided_in_one_module():
    """slm/model/stops.py decides "eos", "length" and "context" for `slm run`, the API and the
    server alike (the engine once had its own copy of generate's stop rules)."""
    found = {path: lines for path, tree in _modules().items() if (lines := _decided_stop_reasons(tree))}
    assert list(found) == ["slm/model/stops.py"], found


_SAMPLING_OPTIONS = {"temperature", "top_p", "seed"}


def _sampling_bound_checks(tree: ast.Module) -> list[int]:
    """Lines comparing a sampling option (a name or attribute temperature / top_p / seed) with
    a number or a constant's name: a bound check."""
    def option(node) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        return name in _SAMPLING_OPTIONS

    def bound(node) -> bool:
        if isinstance(node, ast.UnaryOp):
            node = node.operand
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return name.isupper()

    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Compare)
            and any(map(option, [node.left, *node.comparators])) and any(map(bound, [node.left, *node.comparators]))]


def test_sampling_options_are_validated_in_one_module():
    """slm.model.sampling.check_sampling is the one check of temperature, top_p and seed (the
    server passes its narrower temperature range to it); no other module compares them with
    bounds of its own."""
    found = {path: lines for path, tree in _modules().items() if (lines := _sampling_bound_checks(tree))}
    assert list(found) == ["slm/model/sampling.py"], found
