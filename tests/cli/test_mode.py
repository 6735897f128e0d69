"""The numerics mode (issue 35, slm.model.modes): the default computes integer products over
int8-rounded activations where the C kernels have them; `--exact` / `Runtime(exact=True)`
keeps every product in float32. The mode is what runs, is recorded where the runtime is
described (`slm run --json`, verify results and certificates), never fails by default (no C
kernels: exact), and keeps the prompt cache's entries apart."""

from __future__ import annotations

import numpy as np
import pytest

import slm
from helpers import copy_store, tiny_store
from slm.model import kernels_native

pytestmark = pytest.mark.skipif(not kernels_native.available(), reason="C kernels not built")

PROMPT = "hello there"


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("mode"), tiny_model)


@pytest.fixture
def store_root(template, tmp_path):
    return copy_store(template, tmp_path)


def _run(cli, root, *args):
    r = cli("--store", root, "run", PROMPT, "-n", "4", "--json", *args)
    assert r.code == 0, r.err
    return r.json()


def _logits(cli, root, tmp_path, name, *args):
    out = tmp_path / f"{name}.npy"
    r = cli("--store", root, "run", PROMPT, "-n", "4", "--logits-out", out, *args)
    assert r.code == 0, r.err
    return np.load(out)


def test_the_default_mode_is_int8_and_exact_is_float32(cli, store_root, tmp_path, monkeypatch):
    """With the C kernels the default run says int8 and its logits are not the float32 ones;
    --exact says exact and gives the float32 logits: those of the reference kernels (NumPy,
    no C: SLM_KERNELS=reference) within their 1e-5-scale rounding, where int8 is further."""
    assert _run(cli, store_root)["mode"] == "int8"
    assert _run(cli, store_root, "--exact")["mode"] == "exact"
    default = _logits(cli, store_root, tmp_path, "default")
    exact = _logits(cli, store_root, tmp_path, "exact", "--exact")
    monkeypatch.setenv("SLM_KERNELS", "reference")
    reference = _logits(cli, store_root, tmp_path, "reference", "--exact")
    assert np.abs(exact - reference).max() < 1e-4
    assert np.abs(default - reference).max() > 1e-3
    assert np.abs(default - exact).max() / np.abs(exact).max() < 0.1  # int8 moves logits, boundedly


def test_without_c_kernels_the_default_falls_back_to_exact(cli, store_root, monkeypatch):
    """The default never fails: with SLM_KERNELS=reference (no int8 products) it runs exact and
    says so; --exact is accepted there too."""
    monkeypatch.setenv("SLM_KERNELS", "reference")
    assert _run(cli, store_root)["mode"] == "exact"
    assert _run(cli, store_root, "--exact")["mode"] == "exact"
    assert slm.Runtime(slm.Store.open(store_root)).mode == "exact"


def test_the_prompt_cache_keeps_each_modes_entries_apart(cli, store_root):
    """A prompt cached by a default (int8) run is a miss for --exact (its keys, values and
    logits are not float32's), and each mode then hits its own entry."""
    assert [_run(cli, store_root)["prefix_cache"] for _ in range(2)] == ["miss", "hit"]
    exact = [_run(cli, store_root, "--exact") for _ in range(2)]
    assert [r["prefix_cache"] for r in exact] == ["miss", "hit"]
    assert exact[0]["tokens"] == exact[1]["tokens"]
    assert _run(cli, store_root)["prefix_cache"] == "hit"


def test_the_runtime_mode_is_what_its_sessions_compute(store_root):
    """Runtime() is int8, Runtime(exact=True) exact; a session's logits are those of its mode
    (the exact ones equal a fresh exact runtime's bit for bit, the default's differ)."""
    store = slm.Store.open(store_root)
    default, exact = slm.Runtime(store), slm.Runtime(store, exact=True)
    assert (default.mode, exact.mode) == ("int8", "exact")
    ids = [1, 5, 9, 12, 3]
    ex = exact.session().logits(ids)
    assert ex.tobytes() == slm.Runtime(store, exact=True).session().logits(ids).tobytes()
    assert np.abs(default.session().logits(ids) - ex).max() > 1e-3
    assert default.session().generate(PROMPT, max_tokens=3).mode == "int8"
    assert exact.session().generate(PROMPT, max_tokens=3).mode == "exact"


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_exact_must_be_a_bool(store_root, value):
    with pytest.raises(slm.InvalidInput, match=r"^Runtime\(\): exact must be bool, not "):  # (the API's check)
        slm.Runtime(slm.Store.open(store_root), exact=value)


def test_the_old_activations_flag_is_gone(cli, store_root):
    """One way to say it: `--activations` is a usage error (exit 2) naming the option."""
    r = cli("--store", store_root, "run", PROMPT, "--activations", "int8")
    assert r.code == 2 and "--activations" in r.err


def test_verify_numerics_runs_exact_whatever_the_default(cli, store_root):
    """`slm verify` checks the float32 promise (within 1e-3 of the oracle) and records the
    mode it checked; the default mode would not pass that tolerance, so it is never used."""
    r = cli("--store", store_root, "verify", "--json")
    assert r.code == 0, r.err
    numerics = r.json()["numerics"]
    assert numerics["mode"] == "exact" and numerics["ok"] and numerics["max_abs_error"] <= 1e-3
