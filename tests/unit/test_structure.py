"""The code's own rules, read from the source (each would have caught a debt issue 13 found):
the CLI only parses and prints, no assert stands in for a check, every store write goes
through slm/store/fs.py, broad excepts re-raise, each shared table is built in one place."""

from __future__ import annotations

import ast
import re

from source_tree import ROOT, SLM, _modules


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
    allowed = {"slm", "slm.render", "slm.errors", "slm.api", "slm.store.testing.faults", "slm.ops.infer.run",
               "slm.cli", "slm.cli.common"}
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("slm"):
            names = {a.name for a in node.names}
            beside = node.module.startswith("slm.server.")  # the server sits on the API, as cli does
            assert node.module in allowed or beside or (node.module == "slm.store.testing" and names == {"faults"}), \
                f"slm/cli imports {node.module}: call the API instead"
            if node.module == "slm.ops.infer.run":
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
_OUTSIDE_THE_STORE = {"slm/ops/infer/run.py": "class LogitsFile", "slm/store/testing/powercut.py": None,
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
    ("slm/conversation.py", "_LineReader._serve"): "the line reader's thread hands the exception to the chat "
                                                   "loop, which leaves (end of input) or raises it",
    ("slm/server/catalog.py", "Catalog._watch"): "the refs/active watcher logs a failed look and keeps watching",
    ("slm/server/follower.py", "Follower._run"): "the follower's thread hands what refused its start to "
                                                "start(), which raises it; a later end is logged, the server serves on",
    ("slm/engine/scheduler.py", "Scheduler._loop"):
        "a failed batch step fails its requests (HTTP 500) and the server goes on",
    ("slm/engine/scheduler.py", "Scheduler._guarded"):
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
_TRANSACTIONS = ("slm/ops/store/activation.py", "slm/ops/store/importing.py", "slm/ops/ship/receive.py",
                 "slm/ops/ship/signing.py", "slm/ops/store/gc.py", "slm/ops/store/naming.py",
                 "slm/ops/ship/follow_state.py")


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
    owns them, and every one of them opens it."""
    found = {path: lines for path, tree in _modules().items() if (lines := _journal_protocol_uses(tree))}
    assert set(found) == {_TRANSACTION}, {p: l for p, l in found.items() if p != _TRANSACTION}
    for path in _TRANSACTIONS:
        assert ".transaction(" in (ROOT / path).read_text(), f"{path} does not open a store transaction"


def test_every_journaled_transaction_kind_owns_its_recovery():
    """fsck held every kind's roll-forward and undo in one class, dispatching on strings and
    treating an intent it did not recognise as a switch: now each module that opens a journaled
    transaction names its intent by its KIND, defines `recover` beside it, and the one table
    fsck dispatches on (slm.ops.store.transaction_kinds) lists exactly those."""
    import importlib

    from slm.ops.store.transaction_kinds import RECOVER

    kinds = {}
    for path in _TRANSACTIONS:
        text = (ROOT / path).read_text()
        if "journaled=False" in text:
            continue  # journals nothing: nothing to recover
        module = importlib.import_module(path[:-3].replace("/", "."))
        assert "store.transaction(intent_name(KIND" in text, f"{path}: its intent is not named by its KIND"
        kinds[module.KIND] = module.recover
    assert RECOVER == kinds


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
    """slm/engine/stops.py decides "eos", "length" and "context" for `slm run`, the API and the
    server alike (the engine once had its own copy of generate's stop rules)."""
    found = {path: lines for path, tree in _modules().items() if (lines := _decided_stop_reasons(tree))}
    assert list(found) == ["slm/engine/stops.py"], found


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
    """slm.engine.sampling.check_sampling is the one check of temperature, top_p and seed (the
    server passes its narrower temperature range to it); no other module compares them with
    bounds of its own."""
    found = {path: lines for path, tree in _modules().items() if (lines := _sampling_bound_checks(tree))}
    assert list(found) == ["slm/engine/sampling.py"], found
