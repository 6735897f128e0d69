"""Hypothesis fuzzing of hostile input: composition manifests (line-mutated and structurally
mutated) given to `activate -f`, GGUF headers, safetensors headers, GGUF LoRA headers, and
reflog and journal files as `slm fsck` reads them.

Whatever the bytes: a one-line error with a documented exit code (never 1, the bug code), no
traceback, and the store unchanged; or, when the mutation left valid input, what slm does with
valid input (a manifest of the active composition changes nothing; an accepted base runs; an
accepted adapter is shown), and every step that takes it back succeeds. Example counts come
from a hypothesis settings profile chosen by SLM_FUZZ_PROFILE: "ci" (the default, what `make
test` runs: 700 examples for the first three targets, 150 for the newer ones) or "fuzz" (`make
fuzz`: 10,000 per target, or SLM_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import one_line, snapshot
from slm.cli import run

pytestmark = pytest.mark.slow
DOCUMENTED = {3, 4, 5, 6}
_COMMON = dict(deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("ci", max_examples=700, **_COMMON)
settings.register_profile("ci-small", max_examples=150, **_COMMON)  # the newer targets, in CI
settings.register_profile("fuzz", max_examples=int(os.environ.get("SLM_FUZZ_EXAMPLES", "10000")), **_COMMON)
PROFILE = os.environ.get("SLM_FUZZ_PROFILE", "ci")
FUZZ = settings.get_profile(PROFILE)
FUZZ_SMALL = settings.get_profile("ci-small" if PROFILE == "ci" else PROFILE)


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory, tiny_model):
    from slm.ops.store.activation import activate
    from slm.ops.store.importing import import_base
    from slm.store import init_store

    store, _ = init_store(tmp_path_factory.mktemp("fuzz") / "store")
    import_base(store, tiny_model["gguf_q"], "tq")
    result = activate(store, "tq", [])
    manifest = run_show(store, result.active.id)
    return store, manifest, result.active.id


def run_show(store, comp_id):
    from slm.ops.store.inspect import show_composition

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
    """The store but its derived data (cache/, safe to delete) and names' histories (logs/names/:
    an import taken back with `slm rm` stays in its name's log, as a git branch's reflog)."""
    return {k: v for k, v in state.items() if not k.startswith(("cache", "logs/names"))}


def _accepted_base(capsys, store):
    """A header slm accepts is a base that runs: `slm run --base` on it generates (exit 0, or
    10 if its numbers overflow), then the import is taken back (name removed, `slm gc`) and
    the store is what it was, derived cache aside."""
    def check(before, out) -> None:
        assert store.names.get("bases", "fuzzed") is not None
        _must(capsys, store, ["run", "--base", "fuzzed", "-n", "2", "hello"], codes={0, 10})
        _must(capsys, store, ["rm", "fuzzed"])
        _must(capsys, store, ["gc", "--prune-now"])  # its log entry would keep it for gc.reflog_expiry
        assert _without_cache(snapshot(store.root)) == _without_cache(before)
    return check



def _accepted_adapter(capsys, store):
    """A GGUF LoRA header slm accepts is an adapter the store shows; then the import is taken
    back (name removed, `slm gc`) and the store is what it was, derived cache aside."""
    def check(before, out) -> None:
        assert store.names.get("adapters", "fuzzed") is not None
        _must(capsys, store, ["show", "fuzzed"])
        _must(capsys, store, ["rm", "fuzzed"])
        folder = store.root / "names" / "adapters"  # the first adapter's import made the folder
        if "names/adapters" not in before and not any(folder.iterdir()):
            folder.rmdir()  # (taking the import back by hand takes it back too)
        _must(capsys, store, ["gc", "--prune-now"])
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


def _mutate_tree(value, data, depth: int = 0):
    """A structurally mutated copy of parsed TOML: a field replaced, dropped, added or retyped."""
    if isinstance(value, dict) and value and depth < 4:
        out = dict(value)
        key = data.draw(st.sampled_from(sorted(out)))
        op = data.draw(st.sampled_from(["recurse", "drop", "replace", "add"]))
        if op == "recurse":
            out[key] = _mutate_tree(out[key], data, depth + 1)
        elif op == "drop":
            del out[key]
        elif op == "replace":
            out[key] = data.draw(json_values)
        else:
            out[data.draw(st.text(min_size=1, max_size=8))] = data.draw(json_values)
        return out
    if isinstance(value, list) and value and depth < 4:
        out = list(value)
        i = data.draw(st.integers(0, len(out) - 1))
        op = data.draw(st.sampled_from(["recurse", "drop", "dup"]))
        if op == "recurse":
            out[i] = _mutate_tree(out[i], data, depth + 1)
        elif op == "drop":
            out.pop(i)
        else:
            out.insert(i, out[i])
        return out
    return data.draw(json_values)


def _toml_of(tree) -> str | None:
    import tomlkit

    try:
        return tomlkit.dumps(_toml_safe(tree))
    except Exception:  # a tree TOML cannot express (mixed arrays of tables and values, ...)
        return None


def _toml_safe(value):
    """None has no TOML form: a mutation that drew it gets the empty string instead."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return {str(k): _toml_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_toml_safe(v) for v in value]
    return value


@FUZZ_SMALL
@given(data=st.data())
def test_structurally_mutated_composition_manifests(fuzz_store, tmp_path_factory, capsys, data):
    """Valid TOML, hostile content: each example changes one field of the real manifest (its
    type, its value, its presence) or adds one, then gives it to `activate -f`."""
    import tomllib

    store, manifest, active_id = fuzz_store
    tree = tomllib.loads(manifest)
    for _ in range(data.draw(st.integers(1, 3))):
        tree = _mutate_tree(tree, data)
    text = _toml_of(tree)
    if text is None or text == manifest:
        return
    path = tmp_path_factory.getbasetemp() / "fuzz-tree.toml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    _check(capsys, store, ["activate", "--json", "-f", path], _accepted_manifest(store, active_id))


def _gguf_lora_bytes(tmp_path_factory) -> bytes:
    """A small valid GGUF LoRA for the tiny model (rank 4 on blk.0.attn_q, F32)."""
    import gguf
    import numpy as np

    path = tmp_path_factory.getbasetemp() / "valid-lora.gguf"
    if not path.exists():
        rng = np.random.default_rng(0)
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_type("adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", 8.0)
        w.add_tensor("blk.0.attn_q.weight.lora_a", (rng.standard_normal((4, 64)) * 0.1).astype(np.float32))
        w.add_tensor("blk.0.attn_q.weight.lora_b", (rng.standard_normal((64, 4)) * 0.1).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path.read_bytes()


@FUZZ_SMALL
@given(data=st.data())
def test_malformed_gguf_lora_headers(fuzz_store, tmp_path_factory, capsys, data):
    store, _, _ = fuzz_store
    original = _gguf_lora_bytes(tmp_path_factory)
    header_end = min(len(original), 512)  # the key-value pairs and the tensor table
    blob = bytearray(original[: data.draw(st.sampled_from([len(original), header_end,
                                                             data.draw(st.integers(0, len(original)))]))])
    for _ in range(data.draw(st.integers(1, 8))):
        if not blob:
            break
        i = data.draw(st.integers(0, min(len(blob), header_end) - 1))
        width = data.draw(st.sampled_from([1, 4, 8]))
        value = data.draw(st.sampled_from([0, 1, 4, 6, 0xFF, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
        blob[i:i + width] = value.to_bytes(8, "little")[:width]
    path = tmp_path_factory.getbasetemp() / "fuzz-lora.gguf"
    path.write_bytes(bytes(blob))
    _check(capsys, store, ["import", "adapter", path, "--name", "fuzzed"], _accepted_adapter(capsys, store))


@pytest.fixture(scope="module")
def log_store(tmp_path_factory, tiny_model):
    """A store with three transitions (a reflog of three lines) and the bytes of one intent."""
    from slm.ops.store.activation import activate
    from slm.ops.store.importing import import_base
    from slm.store import init_store

    store, _ = init_store(tmp_path_factory.mktemp("fuzz-log") / "store")
    import_base(store, tiny_model["gguf_q"], "tq")
    import_base(store, tiny_model["gguf"], "tf")
    for base in ("tq", "tf", "tq"):
        activate(store, base, [])
    entries = store.reflog.entries()
    from slm.store import checked_line

    intent = checked_line.encode(f"activate {entries[-1].new} {entries[-2].new} -")
    return store, (store.root / "logs" / "active").read_bytes(), intent


def _mutate_bytes(raw: bytes, data) -> bytes:
    out = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "dup-line", "drop-line"]))
        if op == "flip" and out:
            i = data.draw(st.integers(0, len(out) - 1))
            out[i] = data.draw(st.sampled_from([0, 0x0A, 0x20, 0x2D, 0x30, 0x7F, 0xFF, out[i] ^ 1]))
        elif op == "cut":
            out = out[: data.draw(st.integers(0, len(out)))]
        elif op == "insert":
            i = data.draw(st.integers(0, len(out)))
            out[i:i] = data.draw(st.binary(max_size=12))
        else:
            lines = bytes(out).split(b"\n")
            i = data.draw(st.integers(0, len(lines) - 1))
            if op == "dup-line":
                lines.insert(i, lines[i])
            else:
                lines.pop(i)
            out = bytearray(b"\n".join(lines))
    return bytes(out)


FSCK_CODES = {0, 5, 9}  # clean, damage, an interrupted transaction (docs/exit-codes.md)


def _fsck_on(capsys, store_root, repair: bool) -> int:
    capsys.readouterr()
    code = run(["--store", str(store_root), "fsck", *(["--repair"] if repair else [])])
    out = capsys.readouterr()
    assert code in FSCK_CODES, (code, out.err)
    assert "Traceback" not in out.err + out.out, out.err
    assert not out.err.strip() or one_line(out.err), out.err
    return code


@FUZZ_SMALL
@given(data=st.data())
def test_fuzzed_reflog_and_intents_as_fsck_reads_them(log_store, tmp_path_factory, capsys, data):
    """A damaged logs/active or journal intent: `slm fsck` reports it with 0, 5 or 9 and changes
    nothing; `slm fsck --repair` then leaves a store whose next fsck exits 0 or 5 (damage it
    cannot repair, such as a reflog naming a composition the store lacks), never 9."""
    store, reflog, intent = log_store
    case = tmp_path_factory.getbasetemp() / "fuzz-log-case"
    if case.exists():
        shutil.rmtree(case)
    shutil.copytree(store.root, case, symlinks=True)
    target = data.draw(st.sampled_from(["reflog", "intent", "both"]))
    if target in ("reflog", "both"):
        (case / "logs" / "active").write_bytes(_mutate_bytes(reflog, data))
    if target in ("intent", "both"):
        name = data.draw(st.sampled_from(["active", "import-base-tq", "gc", "x"]))
        (case / "journal" / f"{name}.intent").write_bytes(_mutate_bytes(intent, data))
    before = snapshot(case)
    _fsck_on(capsys, case, repair=False)
    assert snapshot(case) == before, "fsck without --repair changed the store"
    _fsck_on(capsys, case, repair=True)
    assert _fsck_on(capsys, case, repair=False) in (0, 5)
