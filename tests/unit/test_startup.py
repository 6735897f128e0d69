"""What the short-lived commands import: `slm activate` and `slm status` run as a new process
each time, and their start-up is most of their time (notes/perf-notes.md, issue 35). A module
pulled into their import closure by a top-level import (NumPy, the executor, the tokenizer, the
distribution code, the other verbs' results) is caught here by name, not by a timing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import copy_store, tiny_store

# The real `python -m slm` of a child process, which writes the modules it ended with to a file.
CHILD = """
import atexit, runpy, sys
out, argv = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
sys.argv = ["slm", *argv]
runpy.run_module("slm", run_name="__main__")
"""
TIMEOUT = 60  # seconds: a hang, not a slow machine

# slm.model's light modules, each written so as not to import NumPy or the executor; the C
# extension itself (a CPU variant's module, slm.model.cpu_variants, which asks the baseline one
# what the CPU supports) checks an adapter's float32 tensors finite (slm.model.finite)
MODEL_MODULES_ALLOWED = {"slm.model", "slm.model.finite", "slm.model.kernel_choice", "slm.model.modes",
                         "slm.model.cpu_variants", "slm.model._qkernels_baseline", "slm.model._qkernels_avx2",
                         "slm.model._qkernels_avx512", "slm.model._qkernels_native"}


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("startup"), tiny_model, adapters=1)


def modules_of(tmp_path: Path, store: Path, *args: str) -> set[str]:
    """The modules loaded when `slm --store STORE ARGS` has finished (it must succeed)."""
    out = tmp_path / "modules.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("SLM_FAULTS", "SLM_DEBUG")}
    done = subprocess.run([sys.executable, "-c", CHILD, str(out), "--store", str(store), *args],
                          env=env, capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode()
    return set(out.read_text().split())


def heavy(modules: set[str]) -> list[str]:
    """The modules a command on the store's refs and manifests has no use for."""
    return sorted(
        m for m in modules
        if m.split(".")[0] in ("numpy", "rich", "tokenizers", "jinja2", "cryptography", "urllib3")
        or m.startswith(("slm.distribution", "slm.server", "slm.formats.gguf", "slm.quant.registry", "slm.quant.base"))
        or (m.startswith("slm.model.") and m not in MODEL_MODULES_ALLOWED)
        or m in ("slm.ops.store.importing", "slm.ops.infer.loading", "slm.ops.infer.run", "slm.engine.request", "slm.engine.scheduler",
                 "slm.ops.infer.verify", "slm.ops.store.fsck", "slm.ops.ship.bundles", "slm.render_dist")
        or (m.startswith("slm.ops.results.") and m != "slm.ops.results.switches"))


def test_activate_imports_neither_numpy_nor_the_model_nor_the_distribution(tmp_path, template):
    store = copy_store(template, tmp_path)
    modules = modules_of(tmp_path, store, "activate", "tq", "a1@0.5")  # a real switch: adapter blobs read
    assert "slm.ops.store.activation" in modules and "slm.ops.results.switches" in modules  # it ran the activation
    assert heavy(modules) == []
    # it switched: the same light closure did the whole job
    assert "a1" in subprocess.run([sys.executable, "-m", "slm", "--store", str(store), "status"],
                                  capture_output=True, text=True, timeout=TIMEOUT).stdout


def test_activating_the_active_composition_again_stays_as_light(tmp_path, template):
    store = copy_store(template, tmp_path)
    assert heavy(modules_of(tmp_path, store, "activate", "tq")) == []


def test_status_imports_neither_numpy_nor_the_model_nor_the_distribution(tmp_path, template):
    store = copy_store(template, tmp_path)
    modules = modules_of(tmp_path, store, "status", "--json")
    assert "slm.api" in modules  # it opened the store
    assert heavy(modules) == []


def test_the_light_set_is_what_a_generation_does_load(tmp_path, template):
    """The names above are real modules: `slm run` loads NumPy, the executor and the generation
    results, so a misspelt name in `heavy` cannot pass the tests above by matching nothing."""
    store = copy_store(template, tmp_path)
    modules = modules_of(tmp_path, store, "run", "hi", "-n", "1", "--json")
    found = heavy(modules)
    for name in ("numpy", "slm.ops.infer.run", "slm.ops.infer.loading", "slm.ops.results.generation", "slm.quant.registry"):
        assert name in found, name
    assert any(m.startswith("slm.model.") and m not in MODEL_MODULES_ALLOWED for m in found)
