"""The docs that name code are checked against the code: every module and `module.function`
that docs/architecture.md names exists, every package of slm/ is on that map, and the flags a
script's usage line advertises are the flags it takes."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"

# A code reference on the page: in backticks, a path (`slm/ops/infer/run.py`, `slm/model/`) or a
# dotted name (`slm.ops.infer.run`, `slm.ops.infer.run.generate_on`, `slm.api.Session.generate`).
_REFERENCE = re.compile(r"`(slm(?:[./][A-Za-z_][\w]*)*(?:\.py|/)?)`")


def references(text: str) -> list[str]:
    return sorted(set(_REFERENCE.findall(text)))


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body defines: functions, classes, assigned names."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


def _module_file(parts: list[str], root: Path) -> Path | None:
    path = root.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


def unresolved(refs: list[str], root: Path = ROOT) -> list[str]:
    """The references that name no file, module or definition under `root`."""
    missing = []
    for ref in refs:
        if "/" in ref or ref.endswith(".py"):
            if not (root / ref).exists():
                missing.append(ref)
            continue
        parts = ref.split(".")
        # the longest prefix that is a module; the rest are names defined in it (at most a
        # class and one of its members)
        split = next((i for i in range(len(parts), 0, -1) if _module_file(parts[:i], root)), None)
        if split is None:
            missing.append(ref)
            continue
        names, rest = parts[split:], _module_file(parts[:split], root)
        scope = _defined(ast.parse(rest.read_text()).body)
        for name in names:
            node = scope.get(name)
            if node is None:
                missing.append(ref)
                break
            scope = _defined(node.body) if isinstance(node, ast.ClassDef) else {}
    return missing


# A short code name on the page: `Decoder.forward`, `StopRules`, `to_json()`, `fs.atomic_replace`:
# a class (CamelCase) or a call (`()`), alone or with members, or a module's name with a name in
# it. File names (`config.toml`) and single lower-case words (an option, a key) are not names.
_SHORT = re.compile(r"`((?!slm[./])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(\(\))?`")
_FILE_SUFFIXES = {"toml", "json", "md", "py", "gguf", "safetensors", "txt", "c", "h", "so"}


def short_references(text: str) -> list[str]:
    refs = set()
    for name, call in _SHORT.findall(text):
        parts = name.split(".")
        if len(parts) > 1 and parts[-1] in _FILE_SUFFIXES:
            continue
        camel = parts[0][0].isupper() and not parts[0].isupper()
        if camel or call or len(parts) > 1:
            refs.add(name + call)
    return sorted(refs)


def _members(cls: ast.ClassDef) -> set[str]:
    """What a class defines: its body's names, and the attributes its methods set on self."""
    names = set(_defined(cls.body))
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return names


def _index(root: Path) -> tuple[dict[str, list[set[str]]], dict[str, list[dict]], set[str]]:
    """Every class of slm/ by name (its members, one set per definition), every module by its
    last name (the names it defines at the top), and every function and method name."""
    classes: dict[str, list[set[str]]] = {}
    modules: dict[str, list[dict]] = {}
    functions: set[str] = set()
    for path in sorted((root / "slm").rglob("*.py")):
        tree = ast.parse(path.read_text())
        name = path.parent.name if path.name == "__init__.py" else path.stem
        modules.setdefault(name, []).append(_defined(tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(_members(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.add(node.name)
    return classes, modules, functions


def unresolved_short(refs: list[str], root: Path = ROOT) -> list[str]:
    """The short names that name nothing in slm/: a class that no module defines, a member no
    class of that name has, a call no function or method is, a module name no module has or
    whose module does not define the name after it."""
    classes, modules, functions = _index(root)
    missing = []
    for ref in refs:
        call = ref.endswith("()")
        head, *rest = ref.removesuffix("()").split(".")
        if not rest:
            found = head in classes or (call and head in functions)
        elif head in classes:
            found = len(rest) == 1 and any(rest[0] in members for members in classes[head])
        elif head in modules:
            found = any(_resolves(scope, rest) for scope in modules[head])
        else:
            found = False
        if not found:
            missing.append(ref)
    return missing


def _resolves(scope: dict[str, ast.AST], names: list[str]) -> bool:
    for i, name in enumerate(names):
        node = scope.get(name)
        if node is None:
            return False
        if i + 1 < len(names):
            if not isinstance(node, ast.ClassDef):
                return False
            scope = {n: ast.Pass() for n in _members(node)} | _defined(node.body)  # members: no deeper
    return True


def test_every_module_and_function_the_map_names_exists():
    refs = references(MAP.read_text())
    assert len(refs) >= 60, refs  # the page names the path of each request, not a handful
    assert unresolved(refs) == []


def test_every_short_name_the_map_gives_exists():
    """`Decoder.forward` or `Scheduler.submit` on the page, not only `slm.model.decoder....`:
    a call the code does not have fails here, however it is written."""
    refs = short_references(MAP.read_text())
    assert len(refs) >= 5, refs
    assert unresolved_short(refs) == []


def test_the_short_name_check_catches_what_does_not_exist(tmp_path):
    """The check itself, on a small tree of its own: a planted class, member, call or module
    name that the tree does not have is caught; what it has passes, and words that are not
    code names are not taken for names."""
    pkg = tmp_path / "slm" / "ops"
    pkg.mkdir(parents=True)
    (tmp_path / "slm" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "scheduler.py").write_text("class Scheduler:\n    LIMIT = 3\n    def __init__(self):\n"
                                      "        self.pending = []\n    def submit_all(self):\n        pass\n\n"
                                      "def prepare_choices():\n    pass\n")
    present = ["Scheduler", "Scheduler.submit_all", "Scheduler.pending", "Scheduler.LIMIT", "prepare_choices()",
               "scheduler.prepare_choices", "scheduler.Scheduler.submit_all"]
    absent = ["Sched", "Scheduler.submit", "Scheduler.submit_all.inner", "prepare()", "scheduler.prepare",
              "scheduler.Scheduler.prepare", "schedulr.prepare_choices"]
    assert unresolved_short(present + absent, tmp_path) == absent
    text = ("`Scheduler.submit` and `prepare()` beside `slm.ops.run`, `config.toml`, `model`, `SLM_FAULTS`, "
            "`--exact`, `slm run` and `fs.atomic_replace`")
    assert short_references(text) == ["Scheduler.submit", "fs.atomic_replace", "prepare()"]


def test_every_package_of_slm_is_on_the_map():
    text = MAP.read_text()
    packages = [p.name for p in sorted((ROOT / "slm").iterdir()) if (p / "__init__.py").is_file()]
    assert len(packages) >= 9, packages
    assert [p for p in packages if f"`slm/{p}`" not in text] == []


def test_the_map_check_catches_what_does_not_exist(tmp_path):
    """The check itself: a vanished file, module, function, class member or package is caught,
    and what exists passes (the same references against a small tree of its own)."""
    pkg = tmp_path / "slm" / "ops"
    pkg.mkdir(parents=True)
    (tmp_path / "slm" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "run.py").write_text("LIMIT = 3\n\ndef generate_on():\n    pass\n\n"
                                "class Runtime:\n    def stage(self):\n        pass\n")
    present = ["slm/ops/run.py", "slm/ops/", "slm.ops", "slm.ops.run", "slm.ops.run.generate_on",
               "slm.ops.run.LIMIT", "slm.ops.run.Runtime", "slm.ops.run.Runtime.stage"]
    absent = ["slm/ops/gone.py", "slm/oci/", "slm.oci", "slm.ops.gone", "slm.ops.run.run_prompt",
              "slm.ops.run.Runtime.switch", "slm.ops.run.generate_on.inner"]
    assert unresolved(present + absent, tmp_path) == absent
    assert references("`slm/ops/run.py` and `slm.ops.run.generate_on`, not slm.ops.bare or `numpy.x`") == \
        ["slm.ops.run.generate_on", "slm/ops/run.py"]


def test_readme_links_every_page_of_docs_and_each_link_resolves():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?!https?:)[^)#]+)", readme)
    assert [link for link in links if not (ROOT / link).exists()] == []
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert [p for p in pages if p not in links] == []


# ---------------------------------------------------------------- scripts/make_random_lora.py

SCRIPT = ROOT / "scripts" / "make_random_lora.py"


def _advertised_flags() -> list[str]:
    """The flags of the usage lines at the top of the script's docstring."""
    doc = ast.get_docstring(ast.parse(SCRIPT.read_text()))
    usage = doc.split("\n\n")[1]
    return sorted(set(re.findall(r"--[a-z][\w-]*", usage)))


def test_make_random_lora_takes_every_flag_its_usage_advertises():
    flags = _advertised_flags()
    assert {"--rank", "--alpha", "--std", "--seed", "--hidden", "--intermediate", "--layers",
            "--kv-dim", "--q-dim"} <= set(flags)
    helped = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    assert [f for f in flags if f not in helped] == []


@pytest.mark.parametrize("flags,shapes", [
    (["--hidden", "64", "--intermediate", "128", "--layers", "2", "--kv-dim", "32"],
     {"q_proj": (64, 64), "k_proj": (32, 64), "down_proj": (64, 128)}),
    (["--hidden", "64", "--intermediate", "128", "--layers", "2", "--kv-dim", "32", "--q-dim", "96"],
     {"q_proj": (96, 64), "o_proj": (64, 96)}),
    (["--gemma3-270m", "--layers", "2"], {"q_proj": (1024, 640), "k_proj": (256, 640), "up_proj": (2048, 640)}),
], ids=["shape-flags", "q-dim", "gemma3-preset"])
def test_make_random_lora_flags_shape_the_adapter(tmp_path, flags, shapes):
    from safetensors.numpy import load_file

    out = tmp_path / "lora"
    subprocess.run([sys.executable, str(SCRIPT), str(out), "--rank", "4", "--alpha", "8", "--seed", "2", *flags],
                   capture_output=True, text=True, check=True)
    tensors = load_file(str(out / "adapter_model.safetensors"))
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)
    assert {int(k.split(".layers.")[1].split(".")[0]) for k in tensors} == {0, 1}
    for module, (out_f, in_f) in shapes.items():
        prefix = next(k for k in tensors if k.endswith(f"{module}.lora_A.weight")).removesuffix("lora_A.weight")
        assert tensors[prefix + "lora_A.weight"].shape == (4, in_f)
        assert tensors[prefix + "lora_B.weight"].shape == (out_f, 4)
