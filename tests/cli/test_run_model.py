"""Running a composition without activating it (issue 32): `slm run --model SPEC` and
`Runtime.session(spec)` stage any composition as `slm activate` checks it, the signature policy
included, and never touch refs/active or its reflog; and `slm run`'s --system and --stop."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomlkit

from helpers import copy_store, one_line, tiny_store
from slm.errors import ExitCode


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """tq active; adapters a1, a2 (the tiny model's shape) and `narrow` (another hidden size)."""
    import make_random_lora

    root = tmp_path_factory.mktemp("run_model")
    store = tiny_store(root, tiny_model, adapters=2)
    make_random_lora.make_random_lora(root / "narrow", seed=9, rank=4, hidden=32, intermediate=128, layers=2,
                                      kv_dim=32)
    from slm.cli import run

    assert run(["--store", str(store), "import", "adapter", str(root / "narrow"), "--name", "narrow"]) == 0
    return store


@pytest.fixture
def store_dir(template, tmp_path) -> Path:
    return copy_store(template, tmp_path)


def _refs(store_dir: Path) -> dict[str, bytes]:
    """refs/active and the reflog, byte for byte (what only an activation may change)."""
    files = [store_dir / "refs" / "active", *sorted((store_dir / "logs").rglob("*"))]
    return {str(p.relative_to(store_dir)): p.read_bytes() for p in files if p.is_file()}


def _run(cli, store_dir, *args):
    r = cli("--store", store_dir, "run", "Once upon a time", "-n", "8", "--seed", "1", *args, "--json")
    assert r.code == 0, r.err
    return r.json()


def test_run_model_runs_a_composition_without_touching_refs_active(cli, store_dir):
    import slm

    refs = _refs(store_dir)
    assert b"" not in refs.values() and len(refs) >= 2  # the ref and a reflog with the activation
    unactivated = _run(cli, store_dir, "--model", "tq+a1@0.5")
    assert _refs(store_dir) == refs
    assert unactivated["composition"] == slm.Store.open(store_dir).compose("tq", ["a1@0.5"]).id
    # what activating it and running the active composition gives, token for token
    assert cli("--store", store_dir, "activate", "tq", "a1@0.5").code == 0
    active = _run(cli, store_dir)
    assert active["composition"] == unactivated["composition"]
    assert active["tokens"] == unactivated["tokens"]
    assert active["tokens"] != _run(cli, store_dir, "--model", "tq")["tokens"]  # the adapter counts


def test_run_model_accepts_each_spec_form(cli, store_dir):
    assert cli("--store", store_dir, "activate", "tq", "a2").code == 0
    comp_id = cli("--store", store_dir, "status", "--json").json()["active"]["id"]
    assert cli("--store", store_dir, "activate", "tq").code == 0
    refs = _refs(store_dir)
    hex_id = comp_id.removeprefix("blake3:")
    forms = ["tq+a2", "tq+a2@1", comp_id, hex_id, hex_id[:8]]
    runs = {form: _run(cli, store_dir, "--model", form) for form in forms}
    assert {r["composition"] for r in runs.values()} == {comp_id}
    assert len({tuple(r["tokens"]) for r in runs.values()}) == 1
    assert _run(cli, store_dir, "--model", "@active")["composition"] == _run(cli, store_dir, "--model", "tq")[
        "composition"] != comp_id
    assert _refs(store_dir) == refs


def test_runtime_session_stages_an_unstored_composition(store_dir):
    """`rt.session(store.compose(...))` (a composition with no record in the store) and
    `rt.session("BASE+ADAPTER@W")`: the same composition, nothing written."""
    import slm

    store = slm.Store.open(store_dir)
    refs, records = _refs(store_dir), sorted((store_dir / "names" / "compositions").iterdir())
    comp = store.compose("tq", ["a1@0.5"])
    rt = slm.Runtime(store)
    by_object = rt.session(comp).generate("Once upon a time", max_tokens=8)
    by_spec = rt.session("tq+a1@0.5").generate("Once upon a time", max_tokens=8)
    assert by_object.composition == by_spec.composition == comp.id
    assert by_object.tokens == by_spec.tokens
    assert _refs(store_dir) == refs
    assert sorted((store_dir / "names" / "compositions").iterdir()) == records
    with pytest.raises(slm.NotFound, match="no base named 'nosuch'"):
        rt.session("nosuch+a1")


def _unsigned(store_dir: Path) -> tuple[str, ...]:
    path = store_dir / "config.toml"
    doc = tomlkit.parse(path.read_text())
    doc["require_signed"] = True
    path.write_text(tomlkit.dumps(doc))
    return ("tq", "a1@0.5")


def _missing_blob(store_dir: Path) -> tuple[str, ...]:
    import slm

    store = slm.Store.open(store_dir)
    adapter = store.show("a2")
    digest = next(d for target in adapter["targets"] for d in target["tensors"].values())
    store._s.objects.path(digest).unlink()
    return ("tq", "a2")


def _incompatible(store_dir: Path) -> tuple[str, ...]:
    return ("tq", "narrow")


@pytest.mark.parametrize("make,code,message", [
    (_unsigned, ExitCode.INCOMPATIBLE, "not signed"), (_missing_blob, ExitCode.NOT_FOUND, "unknown digest"),
    (_incompatible, ExitCode.INCOMPATIBLE, "narrow"),
])
def test_run_model_refuses_what_activate_refuses_with_its_error(cli, store_dir, make, code, message):
    base, adapter = make(store_dir)
    refs = _refs(store_dir)
    activation = cli("--store", store_dir, "activate", base, adapter)
    assert activation.code == code and message in activation.err, activation.err
    run = cli("--store", store_dir, "run", "hi", "--model", f"{base}+{adapter}")
    assert (run.code, run.err) == (activation.code, activation.err)
    assert one_line(run.err)
    assert _refs(store_dir) == refs
    import slm  # the API's sessions: the same refusal

    with pytest.raises(slm.SlmError) as refusal:
        slm.Runtime(slm.Store.open(store_dir)).session(f"{base}+{adapter}")
    assert refusal.value.code == code and f"slm: error: {refusal.value}\n" == activation.err
    assert _refs(store_dir) == refs


def test_run_model_with_base_is_a_usage_error(cli, store_dir):
    r = cli("--store", store_dir, "run", "hi", "--model", "tq", "--base", "tq")
    assert r.code == ExitCode.USAGE and "--base or --model" in r.err


def test_run_stop_ends_the_text_before_the_stop_sequence(cli, store_dir):
    full = _run(cli, store_dir, "-n", "24")
    text = full["text"]
    stop = next(text[i:i + 2] for i in range(2, len(text) - 2) if text[i:i + 2].isprintable()
                and "\ufffd" not in text[i:i + 2])
    stopped = _run(cli, store_dir, "-n", "24", "--stop", "never-there", "--stop", stop)
    assert stopped["stop_reason"] == "stop"
    assert stopped["text"] == text[:text.index(stop)]
    assert full["stop_reason"] == "length"


def test_run_system_message_goes_before_the_prompt_in_the_chat_template(cli, store_dir):
    import slm

    chat = _run(cli, store_dir, "--chat")
    system = _run(cli, store_dir, "--system", "You are terse.")
    tok = slm.Store.open(store_dir).tokenizer("tq")
    assert "You are terse." in tok.decode(system["prompt_tokens"])
    assert "You are terse." not in tok.decode(chat["prompt_tokens"])
    assert tok.decode(chat["prompt_tokens"]).rstrip() in tok.decode(system["prompt_tokens"])  # the user turn, after it
    session = slm.Runtime(slm.Store.open(store_dir)).session("tq")
    g = session.generate("Once upon a time", max_tokens=8, seed=1, system="You are terse.")
    assert list(g.prompt_tokens) == system["prompt_tokens"] and list(g.tokens) == system["tokens"]


@pytest.mark.parametrize("args,message", [
    (["--stop", "a", "--stop", "b", "--stop", "c", "--stop", "d", "--stop", "e"], "at most 4 sequences"),
    (["--stop", ""], "1 to 256 characters"),
    (["--top-k", "-1"], "top_k must be"),
    (["--min-p", "1.5"], "min_p must be"),
    (["--system", ""], "the system message is empty"),
])
def test_run_sampler_options_are_checked_as_the_server_checks_them(cli, store_dir, args, message):
    refs = _refs(store_dir)
    r = cli("--store", store_dir, "run", "hi", *args)
    assert r.code == ExitCode.INVALID_INPUT and message in r.err and one_line(r.err), r.err
    assert _refs(store_dir) == refs


def test_closing_a_stream_early_ends_its_generation(store_dir):
    """Session.stream's worker stops at its next token once the consumer closes the iterator
    (it used to generate on to max_tokens, unseen)."""
    import threading

    import slm

    session = slm.Runtime(slm.Store.open(store_dir)).session("tq")

    def workers():
        return [t for t in threading.enumerate() if t.name == "slm-session-stream"]

    pieces = session.stream("Once upon a time", max_tokens=200)
    next(pieces)
    assert len(workers()) == 1  # the worker generates
    pieces.close()
    assert workers() == []  # closed: the worker has ended
