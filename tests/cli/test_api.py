"""The public API: docs/api.md's example runs as written on the real SmolLM2 and gives the
tokens `slm run` gives; importing slm sets nothing; __all__ is what `slm` offers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _example() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_importing_slm_changes_no_environment_variable_and_lists_the_api():
    code = ("import os; before = dict(os.environ); import slm; "
            "assert dict(os.environ) == before, 'import slm changed the environment'; "
            "import sys; assert 'numpy' not in sys.modules, 'import slm loaded NumPy'; "
            "print(' '.join(sorted(slm.__all__)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names = set(out.split())
    assert {"Store", "Runtime", "Session", "Composition", "Transition", "Generation", "SlmError",
            "ExitCode", "FsckReport", "VerifyReport", "__version__"} <= names
    import slm

    for name in slm.__all__:
        assert getattr(slm, name) is not None, name


def test_results_are_frozen(store, tiny_model):
    import dataclasses

    import slm

    api = slm.Store.open(store.root)
    api.import_base(tiny_model["gguf_q"], "tq")
    t = api.activate("tq")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.changed = False  # type: ignore[misc]
    assert t.to_json()["active"]["id"] == t.active.id


@pytest.mark.real_model
def test_the_documented_example_runs_and_matches_slm_run(tmp_path, smollm2_gguf, cli):
    store_dir = tmp_path / "apistore"
    namespace = {"STORE_DIR": store_dir, "SMOLLM2_GGUF": smollm2_gguf,
                 "FRENCH_ADAPTER": ROOT / "fixtures" / "demo_adapters" / "french"}
    exec(compile(_example(), "docs/api.md", "exec"), namespace)
    g, comp, pieces, logits = namespace["g"], namespace["comp"], namespace["pieces"], namespace["logits"]
    assert g.composition_id == comp.id and g.tokens
    assert logits.shape == (len(g.prompt_tokens), logits.shape[1]) and logits.dtype.name == "float32"
    assert "".join(pieces)
    # the CLI on the same (active again after the rollback) composition and prompt
    r = cli("--store", store_dir, "run", "--json", "--chat", "-n", "24", "What is the capital of France?")
    assert r.code == 0, r.err
    assert r.json()["composition"] == comp.id
    assert tuple(r.json()["tokens"]) == g.tokens
    assert r.json()["text"] == g.text


def test_session_logits_takes_only_token_ids_of_the_vocabulary(store, tiny_model):
    """A negative id indexed the embedding from its end (the logits of id -1 were those of the
    last id): every id must lie in [0, vocab), as integers, within the context."""
    import slm

    api = slm.Store.open(store.root)
    api.import_base(tiny_model["gguf_q"], "tq")
    comp = api.activate("tq").active.id
    session = slm.Runtime(api).session(comp)
    vocab = session._loaded.model.cfg.vocab_size
    assert session.logits([0, vocab - 1]).shape == (2, vocab)
    for bad in ([-1], [vocab], [1, 2.5], ["7"], [True], [], [0] * (session._loaded.model.cfg.context_length + 1)):
        with pytest.raises(slm.InvalidInput) as err:
            session.logits(bad)
        assert "\n" not in str(err.value) and err.value.code == slm.ExitCode.INVALID_INPUT


def test_upgrade_argument_checks_live_in_the_api(store, tiny_model, cli):
    """`slm activate --upgrade` takes at most a composition: the check is the API's (the CLI
    only passes its arguments on), with the same exit code either way."""
    import slm

    api = slm.Store.open(store.root)
    api.import_base(tiny_model["gguf_q"], "tq")
    with pytest.raises(slm.UsageError):
        api.activate("tq", ["a1"], upgrade=True)
    r = cli("activate", "--upgrade", "tq", "a1")
    assert r.code == 2 and "--upgrade" in r.err


def test_keep_freed_memory_reuses_large_blocks_without_new_page_faults():
    """After slm.keep_freed_memory() (as `slm run` and `slm serve` call it), a 48 MiB array freed
    and allocated again is served from the heap: touching it faults no new pages. By default
    glibc maps every block past its 32 MiB ceiling anew and unmaps it when freed. In a fresh
    process: the setting is process-wide."""
    code = (
        "import resource, numpy as np, slm\n"
        "def faults(n=5):\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    for _ in range(n):\n"
        "        a = np.empty(12 << 20, np.float32); a.fill(1.0); del a\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
        "faults(2)\n"
        "default = faults()\n"
        "assert slm.keep_freed_memory() is True\n"
        "faults(2)\n"
        "print(default, faults())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    default, kept = map(int, out.split())
    # every array faulted in again: 12,288 pages of 4 KiB each, or 24 huge pages where NumPy's
    # madvise gets them (measured here: 2,680 for the five)
    assert default >= 5 * 24
    assert kept < 20
