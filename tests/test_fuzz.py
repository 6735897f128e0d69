"""Hypothesis fuzzing of hostile input: composition manifests, GGUF headers, safetensors headers.

Whatever the bytes: a one-line error with a documented exit code (never 1, the bug code), no
traceback, and the store unchanged; or, when the mutation left valid input, what slm does with
valid input (a manifest of the active composition changes nothing; an accepted base runs), and
every step that takes it back succeeds.
"""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import one_line, snapshot
from slm.cli import run

pytestmark = pytest.mark.slow
DOCUMENTED = {3, 4, 5, 6}
FUZZ = settings(max_examples=700, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory, tiny_model):
    from slm.ops.activation import activate
    from slm.ops.importing import import_base
    from slm.store import init_store

    store, _ = init_store(tmp_path_factory.mktemp("fuzz") / "store")
    import_base(store, tiny_model["gguf_q"], "tq")
    result = activate(store, "tq", [])
    manifest = run_show(store, result.active.id)
    return store, manifest, result.active.id


def run_show(store, comp_id):
    from slm.ops.inspect import show_composition

    return show_composition(store, comp_id)["manifest_toml"]


def _check(capsys, store, args, accepted) -> None:
    """Run slm on fuzzed input: either it is refused with a documented code, one line, and no
    change at all, or it was valid input after all, and `accepted(before, stdout)` checks that
    slm did with it what valid input of that kind must do (and restores the store)."""
    before = snapshot(store.root)
    capsys.readouterr()
    code = run(["--store", str(store.root), *map(str, args)])
    out, err = capsys.readouterr()
    if code == 0:
        accepted(before, out)
        return
    assert code in DOCUMENTED, (code, err)
    assert one_line(err), err
    assert snapshot(store.root) == before


def _must(capsys, store, args, codes=frozenset({0})) -> None:
    """A follow-up step that must succeed (or end in one of `codes` with one line)."""
    capsys.readouterr()
    code = run(["--store", str(store.root), *map(str, args)])
    err = capsys.readouterr().err
    assert code in codes, (args, code, err)
    assert code == 0 or one_line(err), err


def _accepted_manifest(store, active_id: str):
    """The fuzz store holds one base and no adapter: a valid manifest can only name the active
    composition (same base, tokenizer, architecture, profile, runtime, no adapters), and
    activating the active composition changes nothing."""
    def check(before, out) -> None:
        transition = json.loads(out)
        assert transition["changed"] is False and transition["active"]["id"] == active_id, transition
        assert snapshot(store.root) == before
    return check


def _without_cache(state: dict) -> dict:
    return {k: v for k, v in state.items() if not k.startswith("cache")}  # derived, safe to delete


def _accepted_base(capsys, store):
    """A header slm accepts is a base that runs: `slm run --base` on it generates (exit 0, or
    10 if its numbers overflow), then the import is taken back (name removed, `slm gc`) and
    the store is what it was, derived cache aside."""
    def check(before, out) -> None:
        assert store.names.get("bases", "fuzzed") is not None
        _must(capsys, store, ["run", "--base", "fuzzed", "-n", "2", "hello"], codes={0, 10})
        store.names.remove("bases", "fuzzed")
        _must(capsys, store, ["gc"])
        assert _without_cache(snapshot(store.root)) == _without_cache(before)
    return check


def _mutate(text: str, data) -> str:
    lines = text.splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["drop", "dup", "garble", "swap_value", "insert"]))
        if not lines:
            break
        i = data.draw(st.integers(0, len(lines) - 1))
        if op == "drop":
            lines.pop(i)
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "garble":
            line = lines[i]
            j = data.draw(st.integers(0, max(0, len(line) - 1)))
            lines[i] = line[:j] + data.draw(st.text(max_size=5)) + line[j + 1:]
        elif op == "swap_value" and "=" in lines[i]:
            key = lines[i].split("=", 1)[0]
            value = data.draw(st.sampled_from(['""', "1", "-1", "1e400", "nan", "inf", "true", "[]", "{}",
                                               '"blake3:' + "0" * 64 + '"', '"x"', "0.5"]))
            lines[i] = f"{key}= {value}"
        else:
            lines.insert(i, data.draw(st.text(max_size=40)))
    return "\n".join(lines) + "\n"


@FUZZ
@given(data=st.data())
def test_malformed_composition_manifests(fuzz_store, tmp_path_factory, capsys, data):
    store, manifest, active_id = fuzz_store
    text = _mutate(manifest, data) if data.draw(st.booleans()) else data.draw(st.text(max_size=300))
    if text == manifest:
        return
    path = tmp_path_factory.getbasetemp() / "fuzz.toml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    _check(capsys, store, ["activate", "--json", "-f", path], _accepted_manifest(store, active_id))


@FUZZ
@given(data=st.data())
def test_malformed_gguf_headers(fuzz_store, tiny_model, tmp_path_factory, capsys, data):
    store, _, _ = fuzz_store
    original = tiny_model["gguf_q"].read_bytes()
    header_end = 4096  # metadata and tensor table of the tiny file live in its first pages
    blob = bytearray(original[: data.draw(st.integers(0, len(original)))])
    for _ in range(data.draw(st.integers(1, 8))):
        if not blob:
            break
        i = data.draw(st.integers(0, min(len(blob), header_end) - 1))
        width = data.draw(st.sampled_from([1, 4, 8]))
        value = data.draw(st.sampled_from([0, 1, 0xFF, 2**31, 2**63, 2**64 - 1]))
        blob[i:i + width] = value.to_bytes(8, "little")[:width]
    path = tmp_path_factory.getbasetemp() / "fuzz.gguf"
    path.write_bytes(bytes(blob))
    _check(capsys, store, ["import", "base", path, "--name", "fuzzed"], _accepted_base(capsys, store))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@FUZZ
@given(data=st.data())
def test_malformed_safetensors_headers(fuzz_store, tiny_model, tmp_path_factory, capsys, data):
    store, _, _ = fuzz_store
    src = tiny_model["hf"]
    folder = tmp_path_factory.getbasetemp() / "fuzz-hf"
    folder.mkdir(exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((src / name).read_bytes())
    raw = (src / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    if data.draw(st.booleans()):
        name = data.draw(st.sampled_from(sorted(header)))
        field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets", None]))
        if field is None:
            header[name] = data.draw(json_values)
        elif isinstance(header[name], dict):
            header[name][field] = data.draw(json_values)
        head = json.dumps(header).encode()
    else:
        head = data.draw(st.binary(max_size=200))
    declared = data.draw(st.sampled_from([len(head), len(head) + 1, 0, 2**62, len(raw)]))
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", declared) + head + raw[8 + n:])
    _check(capsys, store, ["import", "base", folder, "--name", "fuzzed"], _accepted_base(capsys, store))
