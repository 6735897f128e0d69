"""The code's own rules, read from the source (each would have caught a debt issue 13 found):
the CLI only parses and prints, no assert stands in for a check, every store write goes
through slm/store/fs.py, broad excepts re-raise, each shared table is built in one place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import slm
import slm.errors

ROOT = Path(__file__).resolve().parent.parent
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
    tree = ast.parse((SLM / "cli.py").read_text())
    commands = [fn for _, fn in _functions(tree) if _is_command(fn)]
    assert len(commands) >= 13
    for fn in commands:
        for node in ast.walk(fn):
            assert not isinstance(node, (ast.Raise, ast.Try)), \
                f"cli.py {fn.name}: line {node.lineno} decides (raise/try): move it below the API"
    allowed = {"slm", "slm.render", "slm.errors", "slm.api", "slm.store.testing.faults", "slm.ops.run"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("slm"):
            names = {a.name for a in node.names}
            beside = node.module.startswith("slm.server.")  # the server sits on the API, as cli does
            assert node.module in allowed or beside or (node.module == "slm.store.testing" and names == {"faults"}), \
                f"cli.py imports {node.module}: call the API instead"
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
    ("slm/cli.py", "run"): "the top level: an unexpected exception is a bug, reported in one line (exit 1)",
    ("slm/api.py", "Session.stream"): "the worker thread hands the exception to the consumer, which raises it",
    ("slm/server/catalog.py", "Catalog._watch"): "the refs/active watcher logs a failed look and keeps watching",
    ("slm/server/engine.py", "Engine._loop"): "a failed batch step fails its requests (HTTP 500) and the server goes on",
    ("slm/server/engine.py", "Engine._admit"): "a failed prefill fails its request (HTTP 500) and the server goes on",
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
    assert importers == {"slm/cli.py"}, importers
    long = {p.name: n for p in (SLM / "store" / "testing").glob("*.py")
            if (n := p.read_text().count("\n")) > 450}
    assert long == {}
