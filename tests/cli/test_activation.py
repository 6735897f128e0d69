"""Compositions, refs/active, the reflog and the activate/rollback transaction (tiny bases)."""

from __future__ import annotations

import pytest

from helpers import lock_held_elsewhere, one_line, snapshot
from slm.compose.composition import parse_composition
from slm.store.refs import decode_ref


@pytest.fixture
def two_bases(cli, store, tiny_model):
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("import", "base", tiny_model["hf"], "--name", "th").code == 0
    return store


def _activate(cli, *args):
    r = cli("activate", *args, "--json")
    assert r.code == 0, r.err
    return r.json()


def test_activate_writes_ref_and_reflog(cli, two_bases, store_dir):
    first = _activate(cli, "tq")
    assert first["changed"] and first["previous"] is None
    comp_id = first["active"]["id"]
    assert decode_ref((store_dir / "refs" / "active").read_bytes(), "ref") == comp_id
    log = cli("log", "--json").json()
    assert [(e["seq"], e["op"], e["old"], e["new"]) for e in log] == [(1, "activate", None, comp_id)]
    status = cli("status", "--json").json()
    assert status["active"]["id"] == comp_id and status["active"]["base_name"] == "tq"
    assert not status["interrupted_transaction"] and not status["torn_reflog_tail"]


def test_activating_the_active_composition_changes_nothing(cli, two_bases, store_dir):
    _activate(cli, "tq")
    before = snapshot(store_dir)
    again = _activate(cli, "tq")
    assert again["changed"] is False
    assert snapshot(store_dir) == before


def test_rollback_steps_and_to(cli, two_bases):
    a = _activate(cli, "tq")["active"]["id"]
    b = _activate(cli, "th")["active"]["id"]
    back = _activate_rollback(cli)
    assert back == a
    assert _activate_rollback(cli) == b, "rollback is itself a transition, so it can be undone"
    assert _activate_rollback(cli, "-n", "3") == a
    assert _activate_rollback(cli, "--to", b[7:19]) == b
    ops = [e["op"] for e in cli("log", "--json").json()]
    assert ops == ["rollback"] * 4 + ["activate"] * 2


def _activate_rollback(cli, *args):
    r = cli("rollback", *args, "--json")
    assert r.code == 0, r.err
    return r.json()["active"]["id"]


def test_rollback_past_the_beginning_is_refused(cli, two_bases, store_dir):
    _activate(cli, "tq")
    before = snapshot(store_dir)
    r = cli("rollback")
    assert r.code == 4 and one_line(r.err)
    r = cli("rollback", "-n", "5")
    assert r.code == 4 and one_line(r.err)
    assert snapshot(store_dir) == before


def test_composition_identity_ignores_spelling():
    base, adapter = "blake3:" + "1" * 64, "blake3:" + "2" * 64
    plain = (
        f'schema = "slm.composition/1"\nbase = "{base}"\ntokenizer = "{base}"\n'
        f'architecture = "{base}"\nquant_profile = "q4_1"\n'
        'runtime = { name = "slm", version = "0.1.0" }\n'
        f'[[adapters]]\ndigest = "{adapter}"\nload_order = 1\nweight = 0.7\n'
    )
    # other key order, other float spelling, other whitespace, a name and provenance added
    respelled = (
        f'quant_profile="q4_1"\nschema="slm.composition/1"\narchitecture="{base}"\n'
        f'tokenizer="{base}"\nbase="{base}"\nruntime={{version="0.1.0",name="slm"}}\n'
        '[provenance]\ncreated_at="2020-01-01T00:00:00Z"\n'
        f'[[adapters]]\nweight=7e-1\nload_order=1\nname="renamed"\ndigest="{adapter}"\n'
    )
    a, b = parse_composition(plain.encode()), parse_composition(respelled.encode())
    assert a.id == b.id
    c = parse_composition(respelled.replace("7e-1", "0.75").encode())
    assert c.id != a.id, "the weight is part of the identity"


def _write_manifest(tmp_path, cli, drop=None, **changes):
    base_id = cli("status", "--json").json()["active"]["id"]
    text = cli("show", base_id, "--json").json()["manifest_toml"]
    lines = [ln for ln in text.splitlines() if not (drop and ln.startswith(drop + " "))]
    text = "\n".join(lines) + "\n"
    for key, value in changes.items():
        text = "\n".join(f'{key} = "{value}"' if ln.startswith(key + " ") else ln
                         for ln in text.splitlines()) + "\n"
    path = tmp_path / "comp.toml"
    path.write_text(text)
    return path


def test_activate_from_file(cli, two_bases, tmp_path):
    first = _activate(cli, "tq")["active"]["id"]
    path = _write_manifest(tmp_path, cli)
    _activate(cli, "th")
    again = _activate(cli, "-f", path)
    assert again["active"]["id"] == first


@pytest.mark.parametrize("case,code", [
    ("missing_field", 4), ("tokenizer_mismatch", 6), ("unknown_digest", 3), ("bad_toml", 4),
    ("profile_mismatch", 6), ("runtime_skew", 6),
])
def test_bad_manifests_are_rejected_without_change(cli, two_bases, store_dir, tmp_path, case, code):
    _activate(cli, "tq")
    other_tok = cli("show", "th", "--json").json()["tokenizer"]["digest"]
    if case == "missing_field":
        path = _write_manifest(tmp_path, cli, drop="tokenizer")
    elif case == "tokenizer_mismatch":
        path = _write_manifest(tmp_path, cli, tokenizer=other_tok)
    elif case == "unknown_digest":
        path = _write_manifest(tmp_path, cli, base="blake3:" + "e" * 64)
    elif case == "profile_mismatch":
        path = _write_manifest(tmp_path, cli, quant_profile="q8_0")
    elif case == "runtime_skew":
        path = _write_manifest(tmp_path, cli)
        path.write_text(path.read_text().replace('version = "0.1.0"', 'version = "9.9.9"'))
    else:
        path = tmp_path / "comp.toml"
        path.write_text("this is = = not toml")
    before = snapshot(store_dir)
    r = cli("activate", "-f", path)
    assert r.code == code, r.err
    assert one_line(r.err)
    assert snapshot(store_dir) == before


def test_torn_reflog_tail_blocks_switching(cli, two_bases, store_dir):
    _activate(cli, "tq")
    with open(store_dir / "logs" / "active", "ab") as f:
        f.write(b"2 blake3:abc")  # a crash mid-append
    assert cli("status", "--json").json()["torn_reflog_tail"] is True
    assert len(cli("log", "--json").json()) == 1, "the torn line is not an entry"
    r = cli("activate", "th")
    assert r.code == 9 and "fsck" in r.err


def test_damaged_ref_is_an_integrity_error(cli, two_bases, store_dir):
    _activate(cli, "tq")
    (store_dir / "refs" / "active").write_text("blake3:" + "0" * 64 + " 0000\n")
    r = cli("status")
    assert r.code == 5 and one_line(r.err)


def test_pending_journal_intent_refuses(cli, two_bases, store_dir):
    _activate(cli, "tq")
    (store_dir / "journal" / "active.intent").write_text("garbage\n")
    r = cli("activate", "th")
    assert r.code == 9 and "fsck --repair" in r.err


def test_run_uses_the_active_composition_and_the_prefix_cache(cli, two_bases):
    r = cli("run", "hello there", "-n", "3", "--json")
    assert r.code == 3, "nothing active yet"
    comp = _activate(cli, "tq")["active"]["id"]
    first = cli("run", "hello there", "-n", "4", "--json").json()
    second = cli("run", "hello there", "-n", "4", "--json").json()
    assert first["composition"] == comp
    assert (first["prefix_cache"], second["prefix_cache"]) == ("miss", "hit")
    assert first["tokens"] == second["tokens"]
    _activate(cli, "th")
    switched = cli("run", "hello there", "-n", "4", "--json").json()
    assert switched["prefix_cache"] == "miss", "an entry of another composition is never used"
    direct = cli("run", "hello there", "-n", "4", "--base", "th", "--json").json()
    assert switched["tokens"] == direct["tokens"]


def test_the_prefix_cache_writes_through_the_fs_layer(cli, two_bases, store_dir, monkeypatch):
    """Its directories, its entries and its trimming are fs-layer operations (crash tests and
    fault injection reach them), not writes beside the layer. Recorded through the layer's
    public fault-hook seam, generating with the API (the CLI installs its own hook)."""
    import slm
    from slm.ops.infer import prefix_cache
    from slm.store import digest as dg
    from slm.store import fs

    comp = _activate(cli, "tq")["active"]["id"]
    ops: list[tuple[str, str]] = []
    monkeypatch.setattr(fs, "fault_hook", lambda op, detail: ops.append((op, detail)))
    session = slm.Runtime(slm.Store.open(store_dir)).session()
    session.generate("hello there, a longer prompt", max_tokens=2)
    folder = store_dir / "cache" / "prefix" / dg.hex_of(comp)
    assert ("mkdir", str(folder)) in ops
    first = sorted(folder.glob("*.npz"))
    assert len(first) == 1 and any(op == "rename" and d.endswith(f"-> {first[0]}") for op, d in ops), ops
    # a budget the first entry fills: the next (a shorter prompt's, smaller) pushes it out
    monkeypatch.setattr(prefix_cache, "DEFAULT_PROMPT_BYTES", first[0].stat().st_size)
    session.generate("hi", max_tokens=2)
    assert ("unlink", str(first[0])) in ops, "the older entry is trimmed through fs"
    assert not first[0].exists() and len(list(folder.glob("*.npz"))) == 1


def test_a_json_run_stopped_by_a_switch_prints_one_document(cli, two_bases, monkeypatch):
    """--json and exit 11: stdout is the one result document (it also carried the error
    document), stderr the one error line. The switch is a real activation, made right after
    the run stores its prompt in the prefix cache (after the prompt, before any new token)."""
    import json

    import slm
    from slm.ops.infer.prefix_cache import DiskPromptCache

    pinned = _activate(cli, "tq")["active"]["id"]
    switched: list[bool] = []
    put = DiskPromptCache.put

    def put_then_switch(self, *args, **kwargs):
        put(self, *args, **kwargs)
        if not switched:
            switched.append(slm.Store.open(two_bases.root).activate("th").changed)

    monkeypatch.setattr(DiskPromptCache, "put", put_then_switch)
    r = cli("run", "hello there", "-n", "8", "--json")
    assert switched == [True]
    assert r.code == 11 and one_line(r.err) and "changed during generation" in r.err
    result = json.loads(r.out)  # one document, nothing after it
    assert result["stop_reason"] == "switched" and result["composition"] == pinned


def test_a_held_lock_gives_a_clear_busy_error(cli, two_bases, store_dir):
    config = store_dir / "config.toml"
    config.write_text(config.read_text().replace("lock_timeout_s = 30.0", "lock_timeout_s = 0.3"))

    # another process holds the lock until its stdin closes: however slow the activation, the
    # lock is still held when it asks
    with lock_held_elsewhere(store_dir):
        r = cli("activate", "tq")
        assert r.code == 7 and one_line(r.err) and "lock" in r.err
    assert cli("activate", "tq").code == 0


def test_an_activation_imports_no_numpy(cli, two_bases, store_dir, tmp_path):
    """`slm activate` is a new process each time, and importing NumPy was most of its start-up
    (notes/perf-notes.md): every check of an activation (manifests, tensor sizes, finite adapter
    values, the memory estimate) runs without it, both ways (base + adapter, base alone)."""
    import subprocess
    import sys

    import make_random_lora

    lora = make_random_lora.make_random_lora(tmp_path / "lora", rank=2, hidden=64, intermediate=128,
                                             layers=2, kv_dim=32, seed=3)
    assert cli("import", "adapter", lora, "--name", "l").code == 0
    for args in (["tq", "l"], ["tq"], ["th", "l"]):
        probe = ("import sys; from slm.cli import run; "
                 f"code = run(['--store', {str(store_dir)!r}, 'activate', *{args!r}]); "
                 "print(code, 'numpy' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert out.stdout.split()[-2:] == ["0", "False"], (args, out.stdout, out.stderr)
    assert cli("status", "--json").json()["active"]["base_name"] == "th"


def test_an_activation_loads_no_module_it_does_not_use(cli, two_bases, store_dir, tmp_path):
    """Each module an activation imports is paid for at every `slm activate` (their frozen
    dataclasses are the bulk of that): the signing code (a store that requires no signature)
    and the importers' source classes stay unloaded. (The typed results, one module for every
    verb, load.)"""
    import subprocess
    import sys

    import make_random_lora

    from slm.compose.adapter_manifest import KIND_TENSORS
    from slm.formats.adapter_source import ADAPTER_KINDS

    lora = make_random_lora.make_random_lora(tmp_path / "lora", rank=2, hidden=64, intermediate=128,
                                             layers=2, kv_dim=32, seed=3)
    assert cli("import", "adapter", lora, "--name", "l").code == 0
    unused = ["slm.ops.ship.signing", "slm.formats.adapter_source",
              "slm.formats.base_source", "slm.distribution.signing", "cryptography"]
    probe = ("import sys; from slm.cli import run; "
             f"code = run(['--store', {str(store_dir)!r}, 'activate', 'tq', 'l']); "
             f"print(code, [m for m in {unused!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines()[-1] == "0 []", (out.stdout, out.stderr)
    assert cli("status", "--json").json()["active"]["adapters"][0]["name"] == "l"
    assert set(KIND_TENSORS) == set(ADAPTER_KINDS)  # the manifest's kinds are the importers' kinds
