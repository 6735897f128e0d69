"""Hostile files given to slm (issue 30): bundles for `slm import bundle` (a layout directory or
a tar) and key files. Every one of them goes through one bounded reader: regular files only,
opened non-blocking, sizes known before reading, blobs streamed and hashed into the store.

Each test runs the real CLI in a child process where a hang or a memory bomb is the defect
(a hard timeout turns a hang into a failure; RLIMIT_AS turns an allocation of gigabytes into
one), and asserts the exit code, one line on stderr, an unchanged store and an empty tmp/."""

from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helpers import TINY_LORA, one_line, snapshot, tiny_store

pytestmark = pytest.mark.hostile

SLM = [sys.executable, "-m", "slm"]
HANG = 60  # seconds: far more than any of these refusals takes; past it, slm hung
GIB = 1 << 30
# The address-space limit the memory-bomb tests run under: a normal import of the tiny bundle
# fits in it (test_a_normal_import_fits_the_memory_limit), a blob claiming 3 GiB does not.
MEMORY_LIMIT = 3 * GIB // 2
CLAIM = 3 * GIB
def slm_proc(store: Path, *args, memory_limit: int | None = None, timeout: int = HANG):
    env = {k: v for k, v in os.environ.items() if k not in ("SLM_FAULTS", "SLM_DEBUG")}

    def limit():
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run([*SLM, "--store", str(store), *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, preexec_fn=limit)


def tmp_junk(store: Path) -> list[str]:
    tmp = store / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []


def refused(store: Path, code: int, *args, memory_limit: int | None = None) -> str:
    """The command exits `code` with one line on stderr, the store unchanged, nothing in tmp/."""
    before, junk = snapshot(store), tmp_junk(store)
    r = slm_proc(store, *args, memory_limit=memory_limit)
    assert r.returncode == code, (args, r.returncode, r.stderr)
    assert one_line(r.stderr) and r.stderr.startswith("slm: error: "), r.stderr
    assert snapshot(store) == before, f"{args} changed the store"
    assert tmp_junk(store) == junk, "junk left in the store's tmp/"
    return r.stderr


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_model):
    """A store holding the tiny base + a LoRA, active, and its bundle exported as a directory."""
    root = tmp_path_factory.mktemp("bundles")
    store = tiny_store(root, tiny_model, {"demo": 7}, [("activate", "tiny", "demo@0.7"), ("export", "-o", root / "bundle")],
                       bases={"tiny": "gguf"}, lora={**TINY_LORA, "std": 0.2})
    return {"store": store, "bundle": root / "bundle"}


@pytest.fixture
def target(tmp_path):
    from slm.cli import run

    assert run(["--store", str(tmp_path / "target"), "init"]) == 0
    return tmp_path / "target"


@pytest.fixture
def bundle(exported, tmp_path) -> Path:
    return shutil.copytree(exported["bundle"], tmp_path / "bundle")


def _manifest(bundle: Path) -> tuple[Path, dict]:
    index = json.loads((bundle / "index.json").read_text())
    path = bundle / "blobs" / "sha256" / index["manifests"][0]["digest"][7:]
    return path, json.loads(path.read_text())


def _rewrite_manifest(bundle: Path, manifest: dict) -> None:
    """A changed manifest, index.json pointing at it: a consistent but lying bundle."""
    old, _ = _manifest(bundle)
    data = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(data).hexdigest()
    (bundle / "blobs" / "sha256" / digest).write_bytes(data)
    old.unlink()
    index = json.loads((bundle / "index.json").read_text())
    index["manifests"][0].update(digest=f"sha256:{digest}", size=len(data))
    (bundle / "index.json").write_text(json.dumps(index))


def _tensor_layer(manifest: dict) -> dict:
    from slm.distribution import mediatypes as mt

    return [l for l in manifest["layers"] if l["mediaType"] == mt.TENSOR][3]


def _blob(bundle: Path, descriptor: dict) -> Path:
    return bundle / "blobs" / "sha256" / descriptor["digest"][7:]


def _sparse_member(name: str, size: int) -> tuple[tarfile.TarInfo, bytes]:
    """A PAX 1.0 sparse member: `size` bytes claimed, one byte of data stored (a few KB of tar)."""
    data = f"1\n{size - 1}\n1\n".encode().ljust(512, b"\0") + b"x"
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": name,
                        "GNU.sparse.realsize": str(size)}
    return info, data


def _tar(bundle: Path, out: Path, replace: dict[str, tuple[tarfile.TarInfo, bytes]] = {}) -> Path:
    """The layout directory as a tar, members named in `replace` given as (header, data)."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(bundle.rglob("*")):
            name = str(path.relative_to(bundle))
            if name in replace:
                info, data = replace.pop(name)
                tar.addfile(info, io.BytesIO(data))
            elif path.is_dir():
                tar.add(path, name, recursive=False)
            else:
                tar.add(path, name)
        for info, data in replace.values():
            tar.addfile(info, io.BytesIO(data))
    return out


def _claim(bundle: Path, role: str, size: int) -> str:
    """Make the manifest's config (or a tensor layer) claim `size` bytes under a new digest;
    returns the blob's member name (its file is left for the caller to plant)."""
    path, manifest = _manifest(bundle)
    desc = manifest["config"] if role == "config" else _tensor_layer(manifest)
    _blob(bundle, desc).unlink()
    desc.update(digest="sha256:" + "ab" * 32, size=size)
    _rewrite_manifest(bundle, manifest)
    return "blobs/sha256/" + "ab" * 32


# ------------------------------------------------------------------------------- memory bombs

def test_a_normal_import_fits_the_memory_limit(bundle, target, tmp_path):
    """The limit the bomb tests use is not what refuses them: a real bundle imports under it."""
    for source in (bundle, _tar(bundle, tmp_path / "b.tar")):
        r = slm_proc(target, "import", "bundle", source, memory_limit=MEMORY_LIMIT)
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("role", ["config", "tensor"])
def test_a_sparse_tar_claiming_gigabytes_is_refused_under_a_memory_limit(bundle, target, tmp_path, role):
    """A few KB of tar whose member claims 3 GiB (the issue's 235 KB tar claiming 1.5 GB was
    allocated whole before any digest check): refused before reading, exit 4."""
    name = _claim(bundle, role, CLAIM)
    tar = _tar(bundle, tmp_path / "bomb.tar", {name: _sparse_member(name, CLAIM)})
    assert tar.stat().st_size < 1 << 20
    err = refused(target, 4, "import", "bundle", tar, memory_limit=MEMORY_LIMIT)
    assert "sparse" in err and name in err


def test_a_sparse_file_claiming_gigabytes_in_a_directory_is_refused_under_a_memory_limit(bundle, target):
    name = _claim(bundle, "config", CLAIM)
    with open(bundle / name, "wb") as f:
        f.truncate(CLAIM)
    err = refused(target, 4, "import", "bundle", bundle, memory_limit=MEMORY_LIMIT)
    assert "config" in err and str(CLAIM) in err


def test_a_tar_header_claiming_gigabytes_is_refused_under_a_memory_limit(target, tmp_path):
    """A pax header tarfile would read whole, claiming 3 GiB, in a file of a few KB."""
    header = tarfile.TarInfo("PaxHeaders/oci-layout")
    header.type, header.size = tarfile.XHDTYPE, CLAIM
    bomb = tmp_path / "header.tar"
    bomb.write_bytes(header.tobuf(format=tarfile.USTAR_FORMAT) + b"x" * 4096)
    err = refused(target, 4, "import", "bundle", bomb, memory_limit=MEMORY_LIMIT)
    assert "tar header" in err


def test_a_layer_claiming_more_than_any_blob_can_be_is_refused(bundle, target):
    _claim(bundle, "tensor", 1 << 50)
    err = refused(target, 4, "import", "bundle", bundle)
    assert f"{1 << 50} bytes claimed, more than a blob of its kind can be" in err


# -------------------------------------------------------------------------------------- hangs

@pytest.mark.parametrize("where", ["oci-layout", "index.json", "manifest", "tensor"])
def test_a_fifo_in_a_layout_directory_is_refused_not_waited_on(bundle, target, where):
    path, manifest = _manifest(bundle)
    victim = {"oci-layout": bundle / "oci-layout", "index.json": bundle / "index.json", "manifest": path,
              "tensor": _blob(bundle, _tensor_layer(manifest))}[where]
    victim.unlink()
    os.mkfifo(victim)
    err = refused(target, 4, "import", "bundle", bundle)
    assert "FIFO" in err and victim.name in err


def test_a_fifo_as_the_bundle_itself_is_refused_not_waited_on(target, tmp_path):
    os.mkfifo(tmp_path / "bundle.tar")
    assert "FIFO" in refused(target, 4, "import", "bundle", tmp_path / "bundle.tar")


@pytest.fixture
def signing_store(exported, tmp_path) -> Path:
    return shutil.copytree(exported["store"], tmp_path / "store", symlinks=True)


@pytest.mark.parametrize("command", ["sign", "verify-signature"])
def test_a_fifo_or_a_device_as_a_key_is_refused_not_waited_on(signing_store, tmp_path, command):
    os.mkfifo(tmp_path / "key.pem")
    for key, kind in ((tmp_path / "key.pem", "FIFO"), (Path("/dev/zero"), "device")):
        args = ["sign", "--key", key] if command == "sign" else ["verify", "--signature", "--key", key]
        assert kind in refused(signing_store, 4, *args)


def test_a_missing_key_is_exit_3(signing_store, tmp_path):
    assert "no such file" in refused(signing_store, 3, "sign", "--key", tmp_path / "absent.pem")


@pytest.mark.parametrize("command", ["sign", "verify-signature"])
def test_a_key_file_that_fails_to_read_is_exit_12(signing_store, command):
    """The OS failing the read of a key (EIO; /proc/self/mem is a regular file whose first read
    fails with a real EIO from the kernel) is exit 12, an I/O failure, not bad input."""
    key = "/proc/self/mem"
    args = ["sign", "--key", key] if command == "sign" else ["verify", "--signature", "--key", key]
    assert "Input/output error" in refused(signing_store, 12, *args)


def test_a_fifo_as_a_certificate_is_refused_not_waited_on(tmp_path):
    """check_certificate (Python API) reads a file someone else wrote: through the same reader."""
    os.mkfifo(tmp_path / "cert.json")
    code = ("import sys\nfrom slm.errors import SlmError\nfrom slm.ops.ship.certificates import check_certificate\n"
            "try:\n    check_certificate(sys.argv[1])\nexcept SlmError as err:\n"
            "    print(type(err).__name__, err)\n    sys.exit(int(err.code))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cert.json")], capture_output=True, text=True,
                       timeout=HANG, stdin=subprocess.DEVNULL)
    assert r.returncode == 4, (r.returncode, r.stdout, r.stderr)
    assert r.stdout.startswith("InvalidInput") and "FIFO" in r.stdout, r.stdout


# ------------------------------------------------------------------------- lenient parsing

@pytest.mark.parametrize("which", ["blobs", "blobs/sha256"])
def test_a_symlinked_blobs_directory_is_refused(bundle, target, tmp_path, which):
    real = tmp_path / "elsewhere"
    shutil.move(bundle / which, real)
    (bundle / which).symlink_to(real)
    err = refused(target, 4, "import", "bundle", bundle)
    assert "symlink" in err and which in err


@pytest.mark.parametrize("which", ["blobs", "blobs/sha256"])
def test_a_file_in_place_of_a_blobs_directory_is_refused(bundle, target, which):
    shutil.rmtree(bundle / which)
    (bundle / which).write_text("not a directory")
    err = refused(target, 4, "import", "bundle", bundle)
    assert "is a regular file (not a directory)" in err and which in err


def test_a_symlinked_blob_is_refused(bundle, target):
    _, manifest = _manifest(bundle)
    blob = _blob(bundle, _tensor_layer(manifest))
    shutil.move(blob, blob.parent.parent / "moved")
    blob.symlink_to(blob.parent.parent / "moved")
    assert "symlink" in refused(target, 4, "import", "bundle", bundle)


@pytest.mark.parametrize("stray", ["README", "blobs/sha512", "blobs/sha256/notes.txt"])
def test_stray_entries_in_a_layout_directory_are_refused(bundle, target, stray):
    (bundle / stray).write_text("hello")
    err = refused(target, 4, "import", "bundle", bundle)
    assert "unexpected entry" in err and Path(stray).name in err


# ---------------------------------------------------------------------- codes and messages

@pytest.mark.parametrize("form", ["dir", "tar"])
def test_an_unknown_tag_is_exit_3(bundle, target, tmp_path, form):
    source = bundle if form == "dir" else _tar(bundle, tmp_path / "b.tar")
    assert "no manifest tagged 'nope'" in refused(target, 3, "import", "bundle", source, "--tag", "nope")


@pytest.mark.parametrize("form", ["dir", "tar"])
@pytest.mark.parametrize("role", ["config", "tensor"])
@pytest.mark.parametrize("delta", [-1, 1])
def test_a_blob_shorter_or_longer_than_its_descriptor_is_exit_5(bundle, target, tmp_path, form, role, delta):
    """One code for both (it was 4 for a shorter blob, 5 for a longer one): the bundle does not
    hold the bytes its manifest says."""
    _, manifest = _manifest(bundle)
    desc = manifest["config"] if role == "config" else _tensor_layer(manifest)
    path = _blob(bundle, desc)
    data = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(data[:-1] if delta < 0 else data + b"\0")
    source = bundle if form == "dir" else _tar(bundle, tmp_path / "b.tar")
    err = refused(target, 5, "import", "bundle", source)
    assert f"is {len(data) + delta} bytes, its descriptor says {len(data)}" in err and desc["digest"][:19] in err


@pytest.mark.parametrize("form", ["dir", "tar"])
def test_a_directory_in_place_of_a_blob_names_the_blob(bundle, target, tmp_path, form):
    """It said "cannot access 7: Is a directory": now which blob (short digest and path) and what
    is wrong with it."""
    _, manifest = _manifest(bundle)
    desc = _tensor_layer(manifest)
    path = _blob(bundle, desc)
    path.unlink()
    path.mkdir()
    source = bundle if form == "dir" else _tar(bundle, tmp_path / "b.tar")
    err = refused(target, 4, "import", "bundle", source)
    assert desc["digest"][:19] in err and f"blobs/sha256/{path.name}" in err and "is a directory" in err
