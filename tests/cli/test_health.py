"""`slm health`: the checks of a composition in order, stopped at the first failure, on real tiny
stores; none of them writes to the store."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from helpers import TINY_LORA, copy_store, snapshot, tiny_store, wait_until


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """`ordinary`: tq active, a random LoRA a1; `huge`: an a1 whose B matrices hold values around
    1e12, finite (so imported and staged) but overflowing float32 at weight 1."""
    root = tmp_path_factory.mktemp("health")
    shape = {k: TINY_LORA[k] for k in ("rank", "hidden", "intermediate", "layers", "kv_dim")}
    return {"ordinary": tiny_store(root / "ordinary", tiny_model, adapters=1),
            "huge": tiny_store(root / "huge", tiny_model, adapters=1, lora={**shape, "std": 1e12})}


@pytest.fixture
def store(template, tmp_path):
    return copy_store(template["ordinary"], tmp_path)


def _key(path: Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path, key


def _script(store: Path, name: str, body: str, mode: int = 0o755) -> Path:
    folder = store / "health.d"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(mode)
    return path


def _state(store: Path) -> tuple[dict, dict]:
    """The store's files (snapshot) and health.d's entries by kind and mode, which snapshot would
    read (a FIFO there would block it)."""
    folder = store / "health.d"
    entries = {p.name: (stat.S_IFMT(p.lstat().st_mode), p.lstat().st_mode) for p in folder.iterdir()} \
        if folder.is_dir() else {}
    moved = store.parent / "health.d.aside"
    if folder.is_dir():
        folder.rename(moved)
    try:
        return snapshot(store), entries
    finally:
        if moved.exists():
            moved.rename(folder)


def health(cli, store: Path, *args):
    """`slm health ARGS --json`: (exit code, {check name: (status, reason)}, report), the store
    unchanged by it."""
    before = _state(store)
    r = cli("--store", store, "health", *args, "--json")
    assert _state(store) == before
    report = json.loads(r.out)
    return r.code, {c["name"]: (c["status"], c["reason"]) for c in report["checks"]}, report


def test_a_healthy_composition_passes_every_check_and_a_missing_certificate_is_skipped(cli, store):
    _script(store, "10-env", 'echo "comp=$SLM_COMPOSITION store=$SLM_STORE" >&2\n')
    code, checks, report = health(cli, store)
    active = cli("--store", store, "status", "--json").json()["active"]["id"]
    assert code == 0 and report["healthy"] and report["composition"] == active
    assert list(checks) == ["integrity", "certificate", "generation", "script:10-env"]
    assert checks["certificate"][0] == "skipped"
    assert [checks[n][0] for n in ("integrity", "generation", "script:10-env")] == ["passed"] * 3
    assert checks["script:10-env"][1] == f"comp={active} store={store}"
    human = cli("--store", store, "health")
    assert human.code == 0 and human.out.splitlines()[-1] == f"composition {active}: healthy"


def test_a_certificate_of_the_composition_passes_and_records_golden_answers(cli, store, tmp_path):
    from slm.distribution.signing import check_certificate

    key, _ = _key(tmp_path / "ci.pem")
    cert = tmp_path / "cert.json"
    assert cli("--store", store, "verify", "--certificate", cert, "--key", key).code == 0
    golden = check_certificate(cert.read_bytes())[2]["golden"]
    assert [len(g["tokens"]) for g in golden] == [8, 8]
    code, checks, _ = health(cli, store, "--certificate", cert)
    assert code == 0 and checks["certificate"][0] == "passed", checks


def test_a_damaged_blob_fails_integrity_and_nothing_else_runs(cli, store, tmp_path):
    marker = tmp_path / "ran"
    _script(store, "10-mark", f"touch {marker}\n")
    blob = max((p for p in (store / "objects").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    code, checks, report = health(cli, store)
    assert code == 18 and not report["healthy"]
    assert list(checks) == ["integrity"] and checks["integrity"][0] == "failed"
    assert "missing or corrupt" in checks["integrity"][1] and not marker.exists()


def test_a_certificate_whose_golden_answers_differ_fails(cli, store, tmp_path):
    """The certificate is signed for tq+a1 but carries the answers of tq alone: an adapter that
    changes the answer (the numerics against the oracle still pass: the bytes are right)."""
    from slm.distribution.signing import certificate, check_certificate
    from slm.ops.store import specs
    from slm.store import StoreDir

    marker = tmp_path / "ran"
    _script(store, "10-mark", f"touch {marker}\n")
    key, private = _key(tmp_path / "ci.pem")
    base_cert = tmp_path / "base.json"
    assert cli("--store", store, "verify", "tq", "--certificate", base_cert, "--key", key).code == 0
    result = check_certificate(base_cert.read_bytes())[2]
    with_adapter = specs.resolve(StoreDir.open(store), "tq+a1").id
    lying = tmp_path / "lying.json"
    lying.write_bytes(certificate(with_adapter, result, private))
    code, checks, _ = health(cli, store, "tq+a1", "--certificate", lying)
    assert code == 18 and list(checks) == ["integrity", "certificate"]
    assert checks["certificate"][0] == "failed" and "differs from the certified one" in checks["certificate"][1]
    assert not marker.exists()
    code, checks, _ = health(cli, store, "tq", "--certificate", lying)  # and it is not tq's certificate
    assert code == 18 and checks["certificate"] == ("failed", "the certificate is for another composition")


@pytest.mark.hostile
def test_an_overflowing_adapter_fails_the_generation_check(cli, template, tmp_path):
    """Import refuses non-finite weights; finite ones large enough overflow the network, which the
    engine reports as non-finite or all-equal logits: the generation check is there for them."""
    store = copy_store(template["huge"], tmp_path)
    code, checks, _ = health(cli, store, "tq+a1")
    assert code == 18 and list(checks) == ["integrity", "certificate", "generation"]
    assert checks["generation"][0] == "failed" and "logits all equal" in checks["generation"][1]


def test_a_failing_script_fails_with_its_last_stderr_line_and_stops_the_rest(cli, store, tmp_path):
    marker = tmp_path / "ran"
    _script(store, "10-ok", "exit 0\n")
    _script(store, "20-fail", "echo 'first' >&2\necho 'answer drifted' >&2\necho out\nexit 1\n")
    _script(store, "30-mark", f"touch {marker}\n")
    code, checks, _ = health(cli, store)
    assert code == 18 and list(checks)[-2:] == ["script:10-ok", "script:20-fail"]
    assert checks["script:20-fail"] == ("failed", "exit 1: answer drifted") and not marker.exists()
    r = cli("--store", store, "health")
    assert r.code == 18 and r.err.strip() == "slm: error: unhealthy: the script:20-fail check failed: exit 1: answer drifted"


@pytest.mark.hostile
def test_a_script_past_its_deadline_is_killed_with_its_process_group(cli, store, tmp_path):
    pids = tmp_path / "pids"
    _script(store, "10-sleep", f"sleep 300 &\necho $! > {pids}\nexec sleep 300\n")
    code, checks, _ = health(cli, store, "--timeout", "1")
    assert code == 18 and checks["script:10-sleep"] == ("failed", "killed: still running after its deadline of 1 s")
    child = int(pids.read_text())

    def gone() -> bool:  # (killed: reaped by init, or a zombie for the instant before)
        try:
            return Path(f"/proc/{child}/stat").read_text().split(")")[-1].split()[0] == "Z"
        except FileNotFoundError:
            return True
    wait_until(gone, "the script's background child killed")


@pytest.mark.hostile
def test_fifos_links_directories_and_non_executables_are_reported_not_run(cli, store, tmp_path):
    marker = tmp_path / "ran"
    target = _script(tmp_path, "target", f"touch {marker}\n")
    folder = store / "health.d"
    _script(store, "10-plain", f"touch {marker}\n", mode=0o644)
    os.mkfifo(folder / "20-fifo")
    (folder / "30-link").symlink_to(target)
    (folder / "40-dir").mkdir(mode=0o755)
    code, checks, _ = health(cli, store)
    assert code == 0 and not marker.exists()
    assert {n: s for n, (s, _) in checks.items() if n.startswith("script:")} == dict.fromkeys(
        ["script:10-plain", "script:20-fifo", "script:30-link", "script:40-dir"], "skipped")
    assert "not executable" in checks["script:10-plain"][1] and "FIFO" in checks["script:20-fifo"][1]
    assert "symbolic link" in checks["script:30-link"][1] and "directory" in checks["script:40-dir"][1]
    assert stat.S_ISFIFO((folder / "20-fifo").lstat().st_mode)


@pytest.mark.hostile
def test_a_script_writing_100_mb_is_bounded(cli, store):
    _script(store, "10-loud", "head -c 100000000 /dev/zero\nhead -c 100000000 /dev/zero | tr '\\0' x >&2\n"
                              "printf '\\nlast words\\n' >&2\nexit 2\n")
    code, checks, report = health(cli, store)
    assert code == 18 and checks["script:10-loud"] == ("failed", "exit 2: last words")
    assert len(json.dumps(report)) < 4096


@pytest.mark.parametrize("value", ["0", "-1", "nan", "1e9"])
def test_a_bad_timeout_is_refused(cli, store, value):
    r = cli("--store", store, "health", "--timeout", value)
    assert r.code == 4 and r.err.startswith("slm: error:"), (r.code, r.err)


def test_a_certificate_by_a_key_outside_trusted_keys_fails(cli, store, tmp_path):
    import tomlkit
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from slm.distribution.signing import public_key_text

    key, private = _key(tmp_path / "ci.pem")
    cert = tmp_path / "cert.json"
    assert cli("--store", store, "verify", "--certificate", cert, "--key", key).code == 0
    config = store / "config.toml"
    doc = tomlkit.parse(config.read_text())
    other = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(32))
    doc["trusted_keys"] = [public_key_text(other)]
    config.write_text(tomlkit.dumps(doc))
    code, checks, _ = health(cli, store, "--certificate", cert)
    assert code == 18 and checks["certificate"][0] == "failed" and "not one of trusted_keys" in checks["certificate"][1]
    doc["trusted_keys"] = [public_key_text(private)]
    config.write_text(tomlkit.dumps(doc))
    assert health(cli, store, "--certificate", cert)[1]["certificate"][0] == "passed"


def test_the_api_returns_a_frozen_typed_report(store):
    import dataclasses

    import slm

    report = slm.Store.open(store).health("tq")
    assert isinstance(report, slm.HealthReport) and report.healthy and report.failed is None
    assert [c.name for c in report.checks] == ["integrity", "certificate", "generation"]
    assert all(isinstance(c, slm.HealthCheck) and c.duration_s >= 0 for c in report.checks)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.checks[0].status = "passed"  # type: ignore[misc]
    with pytest.raises(slm.InvalidInput):
        slm.Store.open(store).health("tq", timeout_s=float("inf"))


def _trust(store: Path, *private_keys) -> None:
    import tomlkit

    from slm.distribution.signing import public_key_text

    config = store / "config.toml"
    doc = tomlkit.parse(config.read_text())
    doc["trusted_keys"] = [public_key_text(k) for k in private_keys]
    config.write_text(tomlkit.dumps(doc))


def test_a_certificate_verify_writes_is_recorded_and_checked_without_being_given(cli, store, tmp_path):
    key, _ = _key(tmp_path / "ci.pem")
    r = cli("--store", store, "verify", "--certificate", tmp_path / "cert.json", "--key", key, "--json")
    assert r.code == 0, r.err
    digest = r.json()["recorded"]
    from slm.ops.ship import certificates
    from slm.store import StoreDir

    assert certificates.recorded(StoreDir.open(store), r.json()["composition"]) == \
        [(digest, (tmp_path / "cert.json").read_bytes())]
    assert cli("--store", store, "gc", "--prune-now").code == 0  # what the record lists is kept
    code, checks, _ = health(cli, store)
    assert code == 0 and checks["certificate"][0] == "passed" and "certified by key" in checks["certificate"][1]
    # a certificate is not a signature: `verify --signature` lists none
    assert cli("--store", store, "verify", "--signature", "--json").json()["signatures"] == []
    human = cli("--store", store, "verify", "--certificate", tmp_path / "again.json", "--key", key)
    assert human.code == 0 and "recorded with composition" in human.out


def test_a_certificate_of_a_spec_never_stored_is_written_with_its_golden_answers(cli, store, tmp_path):
    """The golden answers were generated for the composition resolved by its id, which only a
    stored composition has: `verify tq+a1 --certificate` exited 3 after verifying."""
    from slm.distribution.signing import check_certificate
    from slm.ops.store import specs
    from slm.store import StoreDir

    key, _ = _key(tmp_path / "ci.pem")
    r = cli("--store", store, "verify", "tq+a1", "--certificate", tmp_path / "c.json", "--key", key)
    assert r.code == 0, r.err
    comp_id, _, result = check_certificate((tmp_path / "c.json").read_bytes())
    assert comp_id == specs.resolve(StoreDir.open(store), "tq+a1").id and len(result["golden"]) == 2
    assert health(cli, store, "tq+a1", "--certificate", tmp_path / "c.json")[1]["certificate"][0] == "passed"


def test_a_certificate_of_nothing_health_can_check_is_not_recorded(cli, store, tmp_path):
    """--no-numerics certifies no golden answers; a spec never stored has no record to list it."""
    key, _ = _key(tmp_path / "ci.pem")
    before = snapshot(store)
    r = cli("--store", store, "verify", "--no-numerics", "--certificate", tmp_path / "a.json", "--key", key, "--json")
    assert r.code == 0 and r.json()["recorded"] is None and "no numerics" in r.json()["not_recorded"]
    r = cli("--store", store, "verify", "tq+a1", "--certificate", tmp_path / "b.json", "--key", key, "--json")
    assert r.code == 0 and r.json()["recorded"] is None and "not stored" in r.json()["not_recorded"]
    assert snapshot(store) == before
    assert health(cli, store)[1]["certificate"] == ("skipped", "no certificate given or recorded")


def test_recorded_certificates_by_keys_outside_trusted_keys_are_not_judged(cli, store, tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key, private = _key(tmp_path / "ci.pem")
    assert cli("--store", store, "verify", "--certificate", tmp_path / "cert.json", "--key", key).code == 0
    _trust(store, ed25519.Ed25519PrivateKey.from_private_bytes(bytes(32)))
    code, checks, _ = health(cli, store)
    assert code == 0 and checks["certificate"] == (
        "skipped", "1 recorded certificate(s), none signed by a key of trusted_keys")
    _trust(store, private)
    assert health(cli, store)[1]["certificate"][0] == "passed"


def test_every_recorded_certificate_from_a_trusted_key_must_pass(cli, store, tmp_path):
    """A second certificate, signed by the trusted key for tq but carrying the golden answers of
    tq+a1, recorded beside tq's true one: the check fails and names it; a certificate given
    with --certificate is checked instead of the recorded ones."""
    from slm.distribution.signing import certificate, check_certificate
    from slm.ops.ship import certificates
    from slm.store import StoreDir

    key, private = _key(tmp_path / "ci.pem")
    true = tmp_path / "true.json"
    r = cli("--store", store, "verify", "--certificate", true, "--key", key, "--json")
    tq = r.json()["composition"]
    assert cli("--store", store, "verify", "tq+a1", "--certificate", tmp_path / "a1.json", "--key", key).code == 0
    lying = certificate(tq, check_certificate((tmp_path / "a1.json").read_bytes())[2], private)
    handle = StoreDir.open(store)
    with handle.locked():
        digest, added = certificates.record(handle, tq, lying)
    assert added
    _trust(store, private)
    code, checks, _ = health(cli, store)
    assert code == 18 and checks["certificate"][0] == "failed"
    assert checks["certificate"][1].startswith(f"recorded certificate {digest[7:19]}: the answer to ")
    assert health(cli, store, "--certificate", true)[1]["certificate"][0] == "passed"


@pytest.mark.hostile
def test_a_certificate_of_another_composition_is_never_recorded(store, tmp_path):
    from slm.distribution.signing import certificate
    from slm.errors import IntegrityError
    from slm.ops.ship import certificates
    from slm.store import StoreDir

    _, private = _key(tmp_path / "ci.pem")
    handle = StoreDir.open(store)
    active = handle.active_ref.read()
    before = snapshot(store)
    with handle.locked(), pytest.raises(IntegrityError, match="certifies composition"):
        certificates.record(handle, active, certificate("blake3:" + "ab" * 32, {"numerics": {"ok": True}}, private))
    assert snapshot(store) == before
