"""What test_hostile.py and test_hostile_refusals.py share: the real CLI in a child process, the
template store (built once per test file) and each test's own copy of it, fsck's clean bill."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import copy_store, tiny_store

SLM = [sys.executable, "-m", "slm"]
QUICK = 30  # seconds: a command that takes longer than this on a tiny store is a hang


def slm_proc(store_dir, *args, timeout=QUICK, env=None, stdin=None, **kw):
    """Run the real CLI in a child process (for hangs, signals, argv bytes, other users)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("SLM_FAULTS", "SLM_DEBUG")}
    full_env.update(env or {})
    argv = [*SLM, "--store", str(store_dir), *args]
    return subprocess.run(argv, env=full_env, capture_output=True, timeout=timeout,
                          stdin=stdin if stdin is not None else subprocess.DEVNULL, **kw)


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """A store with a base, two adapters and three transitions in its reflog."""
    root = tmp_path_factory.mktemp("hostile")
    store = tiny_store(root, tiny_model, adapters=2,
                       steps=[("activate", "tq"), ("activate", "tq", "a1"), ("activate", "tq", "a2")])
    return {"store": store, "root": root, "tiny": tiny_model}


@pytest.fixture
def store_dir(template, tmp_path) -> Path:
    return copy_store(template["store"], tmp_path)


def fsck_clean(cli, store_dir):
    r = cli("--store", store_dir, "fsck")
    assert r.code == 0, r.out + r.err
