"""Hostile tests of the guarded output path (slm/store/outputs.py, docs/exit-codes.md "Files slm
writes where you ask"): `slm export` in every format, `slm run --logits-out`. A target inside
the store is refused before anything is written; temporaries are created exclusively and only
they are cleaned up; a failing write leaves nothing under the target's name and exits 12."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import copy_store, one_line, refused, tiny_store
from slm.errors import InvalidInput
from slm.store import fs, outputs

pytestmark = pytest.mark.hostile

SLM = [sys.executable, "-m", "slm"]
QUICK = 60  # seconds: a tiny export that takes longer is a hang

# (format arguments, output name): a composition of one adapter is active in the template
FORMATS = {
    "tar": ([], "out.tar"),
    "layout-dir": ([], "out"),
    "gguf-lora": (["--format", "gguf-lora"], "out.gguf"),
    "peft": (["--format", "peft"], "out-peft"),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """A store with a base and one adapter, the composition of both active."""
    return tiny_store(tmp_path_factory.mktemp("hostile-outputs"), tiny_model, adapters=1,
                      steps=[("activate", "tq", "a1")])


@pytest.fixture
def store_dir(template, tmp_path) -> Path:
    return copy_store(template, tmp_path)


def store_still_works(cli, store_dir):
    for args in (("ls",), ("gc",), ("fsck",)):
        r = cli("--store", store_dir, *args)
        assert r.code == 0, (args, r.err)


# --------------------------------------------------------------- export into the store

@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("inside", ["names/compositions", "objects/blake3", "refs", "."])
def test_export_into_the_store_is_refused(cli, store_dir, fmt, inside):
    args, name = FORMATS[fmt]
    target = store_dir / inside / name
    r = refused(cli, store_dir, 4, "export", *args, "-o", target)
    assert "inside the store" in r.err
    assert not os.path.lexists(target)
    store_still_works(cli, store_dir)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_export_through_a_link_into_the_store_is_refused(cli, store_dir, tmp_path, fmt):
    """The real path counts: a symlinked directory, or the store under another spelling."""
    args, name = FORMATS[fmt]
    (tmp_path / "innocent").symlink_to(store_dir / "names" / "compositions")
    refused(cli, store_dir, 4, "export", *args, "-o", tmp_path / "innocent" / name)
    dotted = tmp_path / "elsewhere" / ".." / "store" / "refs" / name
    (tmp_path / "elsewhere").mkdir()
    refused(cli, store_dir, 4, "export", *args, "-o", dotted)
    store_still_works(cli, store_dir)


def test_logits_out_through_a_link_into_the_store_is_refused(cli, store_dir, tmp_path):
    (tmp_path / "innocent").symlink_to(store_dir / "objects")
    r = refused(cli, store_dir, 4, "run", "-n", "1", "--logits-out", tmp_path / "innocent" / "x.npy", "hi")
    assert "inside the store" in r.err


# --------------------------------------------------------------- the temporary is exclusive

def _fixed_temp(monkeypatch, name=".planted"):
    """Make the temporary's name predictable, to plant something there as an attacker who
    guessed it would (the real name holds 48 random bits)."""
    monkeypatch.setattr(fs, "temp_name", lambda directory, stem: directory / f".{stem}{name}")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_link_planted_at_the_temporary_is_never_followed(cli, store_dir, tmp_path, monkeypatch, fmt):
    args, name = FORMATS[fmt]
    precious = tmp_path / "precious"
    precious.write_bytes(b"the user's own data")
    _fixed_temp(monkeypatch)
    planted = tmp_path / f".{name}.planted"
    planted.symlink_to(precious)
    r = refused(cli, store_dir, 12, "export", *args, "-o", tmp_path / name)
    assert precious.read_bytes() == b"the user's own data"
    assert planted.is_symlink(), "the link was not this run's to remove"
    assert not os.path.lexists(tmp_path / name)
    assert "cannot write" in r.err


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_directory_at_the_temporary_is_left_alone(cli, store_dir, tmp_path, monkeypatch, fmt):
    args, name = FORMATS[fmt]
    _fixed_temp(monkeypatch)
    planted = tmp_path / f".{name}.planted"
    planted.mkdir()
    (planted / "keep").write_bytes(b"not slm's")
    refused(cli, store_dir, 12, "export", *args, "-o", tmp_path / name)
    assert (planted / "keep").read_bytes() == b"not slm's", "export deleted files it never made"
    assert not os.path.lexists(tmp_path / name)


def test_temporary_names_are_unpredictable(tmp_path):
    names = {fs.temp_name(tmp_path, "out.tar").name for _ in range(20)}
    assert len(names) == 20
    assert all(n.startswith(f".out.tar.{os.getpid()}.") for n in names)


# --------------------------------------------------------------- a failing write leaves nothing

def _limited(size):
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_write_failing_under_a_file_size_limit_leaves_nothing(store_dir, tmp_path, fmt):
    """`ulimit -f`: every write past the limit fails with EFBIG. Exit 12 in one line (peft's
    SafetensorError was exit 1), no truncated file or empty directory at the target (a rerun
    was refused as "already exists"), and no temporary left beside it."""
    args, name = FORMATS[fmt]
    out_dir = tmp_path / "outputs"
    out_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SLM_FAULTS", "SLM_DEBUG")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    argv = [*SLM, "--store", str(store_dir), "export", *args, "-o", str(out_dir / name)]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=QUICK,
                       preexec_fn=_limited(4096), stdin=subprocess.DEVNULL)
    assert r.returncode == 12, r.stderr
    assert one_line(r.stderr) and "File too large" in r.stderr, r.stderr
    assert list(out_dir.iterdir()) == [], "a partial output or a temporary was left"
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=QUICK, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in out_dir.iterdir()] == [name]


def test_a_failing_run_leaves_no_temporary_beside_logits_out(cli, store_dir, tmp_path):
    out = tmp_path / "logits"
    out.mkdir()
    r = cli("--store", store_dir, "run", "-n", "1", "--logits-out", out / "x.npy", "word " * 5000)
    assert r.code == 4 and one_line(r.err)
    assert list(out.iterdir()) == []


# --------------------------------------------------------------- an existing target

@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_an_existing_target_is_refused_and_kept(cli, store_dir, tmp_path, fmt):
    args, name = FORMATS[fmt]
    target = tmp_path / name
    target.write_bytes(b"the user's own data")
    r = refused(cli, store_dir, 4, "export", *args, "-o", target)
    assert "already exists" in r.err
    assert target.read_bytes() == b"the user's own data"
    dangling = tmp_path / f"link-{name}"
    dangling.symlink_to(tmp_path / "nowhere")
    refused(cli, store_dir, 4, "export", *args, "-o", dangling)
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("syscall", ["renameat2", "no-renameat2"])
def test_the_final_rename_never_replaces_a_name_that_appeared(store_dir, tmp_path, monkeypatch, syscall):
    """Checked at the start, the target may appear while the export runs: the rename into place
    refuses to replace it (renameat2 RENAME_NOREPLACE; without it, a check just before the
    rename), the newcomer is kept, the temporary goes."""
    if syscall == "no-renameat2":
        import ctypes
        import types

        monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kw: types.SimpleNamespace())
    target = tmp_path / "out.gguf"
    with pytest.raises(InvalidInput, match="already exists"):
        with outputs.OutputFile(target, store_dir, "export -o") as out:
            out.write(b"slm's bytes")
            target.write_bytes(b"appeared meanwhile")
            out.commit()
    assert target.read_bytes() == b"appeared meanwhile"
    folder = tmp_path / "out-dir"
    with pytest.raises(InvalidInput, match="already exists"):
        with outputs.OutputDirectory(folder, store_dir, "export -o") as out:
            out.write_file("a", lambda f: f.write(b"slm's bytes"))
            folder.mkdir()  # an empty directory: a plain rename(2) would replace it
            out.commit()
    assert folder.is_dir() and list(folder.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out-dir", "out.gguf", "store"]


def test_logits_out_still_replaces_an_existing_file(cli, store_dir, tmp_path):
    """The documented exception: --logits-out replaces a regular file, once the run succeeded."""
    target = tmp_path / "x.npy"
    target.write_bytes(b"old logits")
    assert cli("--store", store_dir, "run", "-n", "2", "--logits-out", target, "hello").code == 0
    assert np.load(target).dtype == np.float32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store", "x.npy"]


def test_certificate_into_the_store_is_refused_before_verifying(cli, store_dir, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = tmp_path / "ci.pem"
    key.write_bytes(ed25519.Ed25519PrivateKey.from_private_bytes(bytes([1]) * 32).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (tmp_path / "innocent").symlink_to(store_dir / "names")
    for target in (store_dir / "refs" / "cert.json", tmp_path / "innocent" / "cert.json"):
        r = refused(cli, store_dir, 4, "verify", "--certificate", target, "--key", key)
        assert "inside the store" in r.err
        assert not os.path.lexists(target)
