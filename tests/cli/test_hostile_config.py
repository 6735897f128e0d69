"""Issue 30, the store's configuration: config.toml read strictly (an unknown or misplaced key
is an error, never ignored), the signing policy on every path that loads weights, one strict
grammar for adapter weights, fsck's advice about a damaged config.toml, and two digests in one
message printed long enough to differ.

Each refusal: a documented exit code, one line on stderr, the store unchanged (a snapshot of
every file's mode and bytes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

from helpers import copy_store, one_line, refused, snapshot, tiny_store
from slm.errors import Incompatible, IntegrityError, InvalidInput, NotFound
from slm.store import digest as dg

pytestmark = pytest.mark.hostile

SLM = [sys.executable, "-m", "slm"]
QUICK = 60  # seconds: a command that takes longer on a tiny store is a hang (a FIFO read)


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """A store with a base and an adapter, tq + a1 active, nothing signed."""
    return tiny_store(tmp_path_factory.mktemp("config"), tiny_model, adapters=1, steps=[("activate", "tq", "a1@0.5")])


@pytest.fixture
def store_dir(template, tmp_path) -> Path:
    return copy_store(template, tmp_path)


@pytest.fixture(scope="module")
def ci_key(tmp_path_factory) -> tuple[Path, str]:
    """A deterministic Ed25519 key (PEM) and its public text."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from slm.distribution.signing import public_key_text

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32)
    path = tmp_path_factory.mktemp("keys") / "ci.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path, public_key_text(key)


def slm_proc(store_dir, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("SLM_FAULTS", "SLM_DEBUG")}
    return subprocess.run([*SLM, "--store", str(store_dir), *args], env=env, capture_output=True,
                          timeout=QUICK, stdin=subprocess.DEVNULL)


def _policy_on(store_dir: Path, trusted: str) -> None:
    """require_signed where it belongs: the top level (tomlkit puts it above [defaults])."""
    path = store_dir / "config.toml"
    doc = tomlkit.parse(path.read_text())
    doc["require_signed"] = True
    doc["trusted_keys"] = [trusted]
    path.write_text(tomlkit.dumps(doc))


# ------------------------------------------------------------------ strict config.toml

# every command that opens the store reads config.toml; each must refuse, none ignore
CONFIG_READERS = [["status"], ["activate", "tq"], ["run", "hi", "-n", "1"], ["run", "--base", "tq", "hi", "-n", "1"],
                  ["log"], ["ls"], ["gc", "--dry-run"], ["verify", "--no-numerics"], ["deactivate", "a1"],
                  ["rollback"], ["export", "-o", "out-dir"]]


@pytest.mark.parametrize("args", CONFIG_READERS, ids=lambda a: " ".join(a))
def test_require_signed_appended_after_defaults_is_refused_not_ignored(cli, store_dir, tmp_path, args):
    """`printf 'require_signed = true\\n' >> config.toml`: after `slm init`'s [defaults] line the
    key lands in [defaults]. It used to be ignored, leaving the policy off."""
    with open(store_dir / "config.toml", "a") as f:
        f.write('require_signed = true\ntrusted_keys = ["ed25519:x"]\n')
    args = [str(tmp_path / a) if a == "out-dir" else a for a in args]
    err = refused(cli, store_dir, 4, *args).err
    assert "require_signed" in err and "[defaults]" in err and "top level" in err, err
    assert not (tmp_path / "out-dir").exists()


@pytest.mark.parametrize("text, named", [
    ("requre_signed = true\n[defaults]\n", ["'requre_signed'", "top level"]),  # misspelt
    ("[defaults]\nlock_timeout = 5\n", ["'lock_timeout'", "[defaults]", "lock_timeout_s"]),
    ("[policy]\nrequire_signed = true\n", ["[policy]", "[defaults]"]),  # an unknown table
    ("lock_timeout_s = 5\n", ["lock_timeout_s", "top level", "[defaults]"]),  # above its table
    ("[defaults]\ntrusted_keys = []\n", ["trusted_keys", "[defaults]", "top level"]),
    ('require_signed = "yes"\n', ["require_signed", "true or false"]),
    ('trusted_keys = "ed25519:x"\n', ["trusted_keys", "list"]),
    ("defaults = 3\n", ["defaults", "table"]),
    ("[defaults.extra]\nx = 1\n", ["'extra'", "[defaults]"]),
    ("[[defaults]]\nlock_timeout_s = 1\n", ["defaults", "table"]),
])
def test_unknown_or_misplaced_config_keys_are_refused(cli, store_dir, text, named):
    (store_dir / "config.toml").write_text("format = 1\n" + text)
    err = refused(cli, store_dir, 4, "status").err
    assert all(n in err for n in named), (named, err)


def test_the_documented_config_keys_are_accepted(cli, store_dir, ci_key):
    """The strict reader accepts every key docs/concepts.md lists, each in its place."""
    path = store_dir / "config.toml"
    path.write_text('format = 1\nrequire_signed = false\ntrusted_keys = ["%s"]\n\n[defaults]\n'
                    'lock_timeout_s = 5\nmemory_budget = "2G"\n' % ci_key[1])
    assert cli("--store", store_dir, "status").code == 0
    assert cli("--store", store_dir, "activate", "tq").code == 0


def test_fsck_reports_a_bad_config_and_still_checks_the_rest(cli, store_dir):
    with open(store_dir / "config.toml", "a") as f:
        f.write("require_signed = true\n")
    before = snapshot(store_dir)
    for args in (["fsck", "--json"], ["fsck", "--repair", "--json"]):
        r = cli("--store", store_dir, *args)
        assert r.code == 5 and one_line(r.err), (args, r.code, r.err)
        report = r.json()
        assert report["blobs_checked"] > 0, "fsck refused to look at the rest of the store"
        bad = [f for f in report["findings"] if f["problem"] == "bad-config"]
        assert len(bad) == 1 and "require_signed" in bad[0]["what"] and not bad[0]["repaired"]
        assert "slm fsck" not in r.err
    assert snapshot(store_dir) == before, "fsck --repair must not rewrite config.toml (the policy would be lost)"


@pytest.mark.parametrize("kind", ["fifo", "garbage"])
def test_a_damaged_config_tells_what_to_do_not_to_run_fsck(store_dir, kind):
    """A FIFO at config.toml made fsck say "run `slm fsck`": circular. Now fsck reports it
    with the remedy, and following the remedy gives a clean store with its state intact."""
    config = store_dir / "config.toml"
    status = slm_proc(store_dir, "status", "--json")
    active = status.stdout
    config.unlink()
    if kind == "fifo":
        os.mkfifo(config)
    else:
        config.write_bytes(b"format = 1\n[defaults\n")
    for args in (["fsck"], ["fsck", "--repair"], ["status"]):
        r = slm_proc(store_dir, *args)  # a FIFO read that blocked would raise TimeoutExpired
        err = r.stderr.decode()
        assert r.returncode == 5 and one_line(err), (args, r.returncode, err)
        assert "slm fsck" not in err and "slm init" in err, err
    if kind == "fifo":
        assert "FIFO" in slm_proc(store_dir, "fsck").stderr.decode()
    config.unlink()  # the remedy: remove it, `slm init` writes a default one
    assert slm_proc(store_dir, "init").returncode == 0
    assert slm_proc(store_dir, "fsck").returncode == 0
    assert slm_proc(store_dir, "status", "--json").stdout == active


# ------------------------------------------------------- the signing policy on every load

def test_run_base_is_refused_by_the_signing_policy(cli, store_dir, ci_key):
    _policy_on(store_dir, ci_key[1])
    assert "not signed" in refused(cli, store_dir, 6, "run", "--base", "tq", "hi", "-n", "1").err


def test_run_on_an_unsigned_active_composition_is_refused(cli, store_dir, ci_key):
    """Activated before the policy was turned on: running it is still refused."""
    _policy_on(store_dir, ci_key[1])
    assert "not signed" in refused(cli, store_dir, 6, "run", "hi", "-n", "1").err
    assert cli("--store", store_dir, "sign", "--key", ci_key[0]).code == 0
    r = cli("--store", store_dir, "run", "hi", "-n", "1")
    assert r.code == 0, r.err  # the same composition, signed by the trusted key, runs


def test_verify_numerics_is_refused_but_integrity_alone_is_not(cli, store_dir, ci_key):
    _policy_on(store_dir, ci_key[1])
    assert "not signed" in refused(cli, store_dir, 6, "verify").err
    assert cli("--store", store_dir, "verify", "--no-numerics").code == 0  # no weights run


def test_api_sessions_are_refused_by_the_signing_policy(store_dir, ci_key):
    import slm
    from slm.api import GenerationRequest
    from slm.ops.infer.run import RunOptions

    _policy_on(store_dir, ci_key[1])
    store = slm.Store.open(store_dir)
    before = snapshot(store_dir)
    runtime = slm.Runtime(store)
    with pytest.raises(Incompatible, match="not signed"):
        runtime.session()  # the active composition
    with pytest.raises(Incompatible, match="not signed"):
        runtime.session(store.compose("tq", ["a1@0.5"]))
    with pytest.raises(Incompatible, match="not signed"):
        store.run(RunOptions(GenerationRequest("hi", max_tokens=1), base="tq"))
    assert snapshot(store_dir) == before


def test_the_server_serves_nothing_unsigned(store_dir, ci_key):
    """The server's catalog (what `slm serve` stages for refs/active and for a request's
    `model`) loads through the same function."""
    import slm
    from slm.server.catalog import Catalog

    _policy_on(store_dir, ci_key[1])
    catalog = Catalog(slm.Runtime(slm.Store.open(store_dir)), log=lambda line: None)
    catalog.poll(initial=True)
    assert catalog.active is None and "not signed" in catalog.active_error
    for model in ("tq", "tq+a1@0.5", None):
        with pytest.raises((Incompatible, NotFound), match="not signed"):
            catalog.resolve(model)


# ----------------------------------------------------------------- the weight grammar

@pytest.mark.parametrize("weight", ["1_0", "0_5", "\u0661", "\u0660\u066b\u0665", "\uff11", " 0.5", "0.5 ",
                                    "0x1p-1", "1e", ".", "+", "1.5.2", "\u00bd"])
def test_lenient_weights_are_refused(cli, store_dir, weight):
    """float() read "1_0" as 10 and Arabic-Indic digits as numbers; the grammar is ASCII decimal."""
    err = refused(cli, store_dir, 4, "activate", "tq", f"a1@{weight}").err
    assert "not a number" in err and "ASCII" in err, err


@pytest.mark.parametrize("weight, value", [("0.5", 0.5), (".5", 0.5), ("-1", -1.0), ("+2e-1", 0.2), ("3.", 3.0)])
def test_ascii_decimal_weights_are_accepted(cli, store_dir, weight, value):
    r = cli("--store", store_dir, "activate", "tq", f"a1@{weight}", "--json")
    assert r.code == 0, r.err
    assert r.json()["active"]["adapters"][0]["weight"] == value


def test_the_server_parses_weights_with_the_same_grammar(store_dir):
    import slm
    from slm.server.catalog import Catalog

    catalog = Catalog(slm.Runtime(slm.Store.open(store_dir)), log=lambda line: None)
    for model in ("tq+a1@1_0", "tq+a1@\u0661"):
        with pytest.raises(InvalidInput, match="not a number"):
            catalog.resolve(model)
    assert catalog.resolve("tq+a1@0.25").composition.adapters[0].weight == 0.25


def test_unicode_digits_in_a_memory_budget_are_refused(cli, store_dir):
    refused(cli, store_dir, 4, "activate", "tq", "--memory-budget", "\u0662G")


# ------------------------------------------------------- two digests side by side

def test_two_digests_in_one_message_print_long_enough_to_differ():
    a = dg.PREFIX + "5febcd005c42" + "0" * 52
    b = dg.PREFIX + "5febcd005c42" + "7" + "0" * 51
    sa, sb = dg.short_pair(a, b)
    assert sa != sb and a[len(dg.PREFIX):].startswith(sa) and b[len(dg.PREFIX):].startswith(sb)
    assert dg.short_pair(a, dg.PREFIX + "f" * 64) == (dg.short(a), "f" * 12)  # differing early: short
    last = dg.PREFIX + "0" * 63 + "1"
    assert dg.short_pair(last, dg.PREFIX + "0" * 64) == ("0" * 63 + "1", "0" * 64)


def test_a_signature_for_a_lookalike_id_names_both_ids_distinctly(store_dir, ci_key):
    from slm.distribution import signing
    from slm.store import StoreDir

    comp_id = StoreDir.open(store_dir).active_ref.read()
    lookalike = comp_id[:len(dg.PREFIX) + 12] + ("0" if comp_id[-52] != "0" else "1") + comp_id[-51:]
    blob = signing.sign(lookalike, signing.load_private_key(ci_key[0]))
    with pytest.raises(IntegrityError) as err:
        signing.parse_signature(blob, comp_id)
    message = str(err.value)
    named, wanted = dg.short_pair(lookalike, comp_id)
    assert f"signs composition {named}, not {wanted}" in message and named != wanted


def test_fsck_ref_mismatch_names_a_lookalike_ref_distinctly(cli, store_dir):
    from slm.store import StoreDir

    store = StoreDir.open(store_dir)
    committed = store.active_ref.read()
    lookalike = committed[:len(dg.PREFIX) + 12] + ("0" if committed[-52] != "0" else "1") + committed[-51:]
    store.active_ref.write(lookalike)
    r = cli("--store", store_dir, "fsck", "--json")
    assert r.code == 9
    what = next(f["what"] for f in r.json()["findings"] if f["problem"] == "ref-mismatch")
    ref_short, committed_short = dg.short_pair(lookalike, committed)
    assert ref_short != committed_short
    assert f"refs/active is {ref_short}; the last committed transition made {committed_short} active" == what


def test_slm_serve_refuses_unsigned_models_and_lenient_weights_over_http(store_dir, ci_key):
    """The real server process: what refs/active names is not served, a request naming an
    unsigned spec is 400 with the same one line, and a weight outside the grammar is 400."""
    from serve_helpers import Server

    _policy_on(store_dir, ci_key[1])
    server = Server(store_dir)
    try:
        assert "not signed" in server.status()["active_error"]
        for model, says in (("tq+a1@0.5", "not signed"), ("tq", "not signed"), ("tq+a1@1_0", "not a number"),
                            ("tq+a1@\u0661", "not a number")):
            status, body = server.json("POST", "/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
            assert status == 400 and says in json.dumps(body), (model, status, body)
    finally:
        assert server.stop() == 0


def test_slm_serve_refuses_to_start_on_a_misplaced_policy(store_dir):
    with open(store_dir / "config.toml", "a") as f:
        f.write("require_signed = true\n")
    r = slm_proc(store_dir, "serve", "--port", "0")
    err = r.stderr.decode()
    assert r.returncode == 4 and one_line(err) and "require_signed" in err, (r.returncode, err)


@pytest.mark.parametrize("args", [["run", "--max-tokens", "1_0", "hi"], ["run", "-n", "\u0661", "hi"],
                                  ["run", "--temperature", "0_5", "hi"], ["run", "--seed", "\uff17", "hi"],
                                  ["run", "--top-p", " 1", "hi"], ["rollback", "-n", "\u0662"],
                                  ["serve", "--port", "8_080"], ["serve", "--grace", "1_0"]])
def test_lenient_numbers_in_options_are_usage_errors(cli, store_dir, args):
    """click's int / float took "1_0" as 10 and any Unicode digit: options share the grammar."""
    err = refused(cli, store_dir, 2, *args).err
    assert "Invalid value" in err, err


def test_ascii_numbers_in_options_are_read(cli, store_dir):
    r = cli("--store", store_dir, "run", "--max-tokens", "+2", "--temperature", ".5", "--seed", "7", "hi", "--json")
    assert r.code == 0, r.err
    assert len(r.json()["tokens"]) <= 2


def test_fsck_refuses_a_store_of_another_format(cli, store_dir):
    """Opening a store with a damaged config.toml for fsck must not open one of a newer format:
    --repair would rewrite what it does not understand."""
    path = store_dir / "config.toml"
    path.write_text(path.read_text().replace("format = 1", "format = 2"))
    (store_dir / "tmp" / "left-over").write_text("what fsck --repair removes from a format-1 store")
    for args in (["fsck"], ["fsck", "--repair"], ["status"]):
        err = refused(cli, store_dir, 5, *args).err
        assert "format 2 is not supported" in err, err


def test_a_bundle_config_naming_a_lookalike_id_says_where_they_differ(cli, store_dir, tmp_path):
    """"config names 5febcd005c42 but the record is 5febcd005c42": the ids differed past the
    twelfth digit. Exported, the config blob's composition_id changed to such a lookalike."""
    import hashlib

    bundle = tmp_path / "bundle"
    assert cli("--store", store_dir, "export", "-o", bundle).code == 0
    blobs = bundle / "blobs" / "sha256"
    index = json.loads((bundle / "index.json").read_text())
    manifest_path = blobs / index["manifests"][0]["digest"][7:]
    manifest = json.loads(manifest_path.read_text())
    config_path = blobs / manifest["config"]["digest"][7:]
    config = json.loads(config_path.read_text())
    real = config["composition_id"]
    lookalike = real[:len(dg.PREFIX) + 12] + ("0" if real[-52] != "0" else "1") + real[-51:]
    config["composition_id"] = lookalike

    def put(doc: dict) -> tuple[str, int]:
        data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    manifest["config"]["digest"], manifest["config"]["size"] = put(config)
    digest, size = put(manifest)
    index["manifests"][0].update(digest=digest, size=size)
    (bundle / "index.json").write_text(json.dumps(index))
    target = tmp_path / "target"
    assert cli("--store", target, "init").code == 0
    err = refused(cli, target, 5, "import", "bundle", bundle).err
    named, record = dg.short_pair(lookalike, real)
    assert f"the config names composition {named} but the record is composition {record}" in err, err
    assert named != record
