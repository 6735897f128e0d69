"""`slm pull` against a registry that sends more, or other, bytes than it should (issue 30):
every blob is streamed into the store's tmp/ and hashed on the way, never held whole; a body
longer or shorter than its descriptor is refused (exit 5), a body cut off mid-transfer is a
broken response (exit 12); either way the store is unchanged (a broken response leaves in
tmp/ only what arrived whole and verified, for the next pull to resume). And the Docker config
file, which every push and pull reads for credentials, is read as any file someone else wrote:
a FIFO or an oversize file there is one line, exit 4, never a hang.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import subprocess
import sys

import pytest

from fake_registry import FakeRegistry, basic, blobs_redirected_to, read_layout
from helpers import one_line, snapshot, tiny_store

pytestmark = pytest.mark.hostile

SLM = [sys.executable, "-m", "slm"]
HANG = 300  # seconds: a pull that takes longer than this is a hang (the machine is loaded)
LOOKUP_HANG = 60  # seconds: a pull that only looks its credentials up and is refused
REPO = "fleet/tiny"
TENSOR = "application/vnd.slm.tensor.v1"
SECRET = "hunter2-s3cret"

# The child may map at most ADDRESS_SPACE bytes, and is sent a blob of twice that: held whole,
# it cannot fit (MemoryError), streamed it must. One malloc arena and 2 MiB thread stacks make
# the address space a pull needs small and steady (glibc reserves 64 MiB per thread's arena and
# 8 MiB per thread's stack otherwise, whatever is used); a normal pull needs under 150 MiB so.
ADDRESS_SPACE = 512 << 20
HUGE = 2 * ADDRESS_SPACE
ZEROS = bytes(1 << 20)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_model):
    """The tiny base, active in a store and exported as an OCI layout: (manifest, blobs)."""
    root = tmp_path_factory.mktemp("hostile-pull")
    tiny_store(root, tiny_model, steps=[("activate", "tq"), ("export", "-o", root / "layout")])
    return read_layout(root / "layout")


@pytest.fixture
def empty_store(cli, tmp_path):
    store = tmp_path / "receiver"
    assert cli("--store", store, "init").code == 0
    return store


def child_env(tmp_path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLM_FAULTS", "SLM_DEBUG", "SLM_REGISTRY_AUTH", "DOCKER_CONFIG")}
    env.update(HOME=str(tmp_path / "home"), MALLOC_ARENA_MAX="1", **extra)
    return env


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_STACK, (2 << 20, 2 << 20))
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def pull_in_child(store, reference, env) -> subprocess.CompletedProcess:
    """`slm pull` in a child held to ADDRESS_SPACE bytes of memory."""
    return subprocess.run([*SLM, "--store", str(store), "pull", reference], env=env, capture_output=True,
                          text=True, timeout=HANG, stdin=subprocess.DEVNULL, preexec_fn=_limited)


def with_size(manifest: bytes, index: int, size: int) -> bytes:
    """The manifest with layer `index`'s descriptor claiming `size` bytes (its digests unchanged)."""
    doc = json.loads(manifest)
    doc["layers"][index]["size"] = size
    return json.dumps(doc).encode()


def first_tensor(manifest: bytes) -> tuple[int, str]:
    """(index, sha256 digest) of the manifest's first tensor layer."""
    layers = json.loads(manifest)["layers"]
    index = next(i for i, l in enumerate(layers) if l["mediaType"] == TENSOR)
    return index, layers[index]["digest"]


def serving(digest: str, content_length: int, sent: int):
    """A registry whose GET of blob `digest` promises `content_length` bytes and sends `sent`
    zero bytes, generated as they go (never held by the server either), then closes; the bytes
    it managed to send are counted in `server.zeros_sent`."""

    def misbehave(handler):
        if not handler.path.endswith(f"/blobs/{digest}"):
            return False
        handler.server.zeros_sent = 0
        handler.close_connection = True
        try:
            handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % content_length)
            while handler.server.zeros_sent < sent and not handler.server.stopping.is_set():
                piece = ZEROS[:sent - handler.server.zeros_sent]
                handler.wfile.write(piece)
                handler.server.zeros_sent += len(piece)
            handler.wfile.flush()
        except OSError:
            pass  # the client went away: what it refused was not read
        return True

    return misbehave


def assert_refused(r, store, before, code) -> None:
    """Refused (exit 5): the store as it was, nothing staged left behind. Interrupted (exit 12,
    a broken or overdue response: pulling again may succeed): the store as it was but for the
    pull's staging under tmp/, which keeps only blobs that arrived whole and verified, each
    named by its digest (the next pull resumes from them), never a part of the blob cut off."""
    assert r.returncode == code, (r.returncode, r.stderr)
    assert one_line(r.stderr) and "internal error" not in r.stderr and "MemoryError" not in r.stderr, r.stderr
    if code != 12:
        assert snapshot(store) == before
        assert not any((store / "tmp").iterdir())
        return
    assert {k: v for k, v in snapshot(store).items() if not k.startswith("tmp/")} == before
    for area in (store / "tmp").iterdir():
        assert area.name.startswith("pull-")
        assert all(len(f.name) == 64 or f.name == ".lock" for f in area.iterdir())


def test_a_blob_twice_the_address_space_is_streamed_not_held(bundle, empty_store, tmp_path):
    """Issue 30: a registry blob was read whole into memory, bounded only by its descriptor
    (up to 64 GiB): a manifest claiming a huge tensor made `slm pull` allocate all of it (exit 8,
    out of memory, or the OOM killer). Now it is streamed to tmp/ and hashed: its bytes are
    not the digest's, exit 5, in a process that could never have held them."""
    manifest, blobs = bundle
    index, digest = first_tensor(manifest)
    with FakeRegistry(with_size(manifest, index, HUGE), blobs, misbehave=serving(digest, HUGE, HUGE)) as reg:
        before = snapshot(empty_store)
        r = pull_in_child(empty_store, f"{reg.host}/{REPO}:v1", child_env(tmp_path))
        assert reg.zeros_sent == HUGE  # the child read all of it
    assert_refused(r, empty_store, before, 5)
    assert "does not hash to its sha256 digest" in r.stderr


def test_a_huge_blob_cut_off_mid_transfer_is_a_broken_response(bundle, empty_store, tmp_path):
    """The same huge blob, its connection closed after more bytes than the child may map:
    a broken response (exit 12, a retry may succeed), not an allocation of the whole."""
    manifest, blobs = bundle
    index, digest = first_tensor(manifest)
    cut = ADDRESS_SPACE + (64 << 20)
    with FakeRegistry(with_size(manifest, index, HUGE), blobs, misbehave=serving(digest, HUGE, cut)) as reg:
        before = snapshot(empty_store)
        r = pull_in_child(empty_store, f"{reg.host}/{REPO}:v1", child_env(tmp_path))
        assert reg.zeros_sent == cut
    assert_refused(r, empty_store, before, 12)
    assert "broken HTTP response" in r.stderr and "IncompleteRead" in r.stderr


def test_a_streamed_body_longer_than_its_descriptor_is_cut_at_the_first_extra_byte(bundle, empty_store,
                                                                                  tmp_path):
    """A layer whose descriptor says 2 MiB (streamed, over receive.AHEAD_MAX) served as an
    endless body: refused (exit 5) once one byte more than 2 MiB arrived; the rest is never
    read (the server could only push what the sockets buffer before the client hung up)."""
    manifest, blobs = bundle
    index, digest = first_tensor(manifest)
    claimed, offered = 2 << 20, 8 << 30
    with FakeRegistry(with_size(manifest, index, claimed), blobs,
                      misbehave=serving(digest, offered, offered)) as reg:
        before = snapshot(empty_store)
        r = pull_in_child(empty_store, f"{reg.host}/{REPO}:v1", child_env(tmp_path))
        assert claimed < reg.zeros_sent < offered // 64
    assert_refused(r, empty_store, before, 5)
    assert "longer than the 2097152 bytes its descriptor says" in r.stderr


def test_a_streamed_body_shorter_than_its_descriptor_is_exit_5(bundle, empty_store, tmp_path):
    """A layer whose descriptor says 2 MiB, served whole and well-formed (its Content-Length
    honoured) but shorter: the blob is not what the manifest describes, exit 5."""
    manifest, blobs = bundle
    index, digest = first_tensor(manifest)
    with FakeRegistry(with_size(manifest, index, 2 << 20), blobs) as reg:
        before = snapshot(empty_store)
        r = pull_in_child(empty_store, f"{reg.host}/{REPO}:v1", child_env(tmp_path))
    assert_refused(r, empty_store, before, 5)
    assert f"is {len(blobs[digest])} bytes, its descriptor says 2097152" in r.stderr


def test_a_streamed_body_that_trickles_is_cut_off_by_the_deadline(bundle, empty_store, tmp_path):
    """A streamed layer's body is under its request's clock like any response: a registry that
    sends one byte of it every quarter second is cut off (exit 12, "too slow"), not waited on
    while it would keep trickling for minutes."""
    manifest, blobs = bundle
    index, digest = first_tensor(manifest)

    def trickle(handler):
        if not handler.path.endswith(f"/blobs/{digest}"):
            return False
        handler.close_connection = True
        try:
            handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
            while not handler.server.stopping.wait(0.25):
                handler.wfile.write(b"\0")
                handler.wfile.flush()
        except OSError:
            pass
        return True

    env = child_env(tmp_path, SLM_REGISTRY_TIMEOUT_S="1", SLM_REGISTRY_MIN_RATE="1000")
    with FakeRegistry(with_size(manifest, index, 2 << 20), blobs, misbehave=trickle) as reg:
        before = snapshot(empty_store)
        r = pull_in_child(empty_store, f"{reg.host}/{REPO}:v1", env)
    assert_refused(r, empty_store, before, 12)
    assert "GET too slow" in r.stderr and "SLM_REGISTRY_MIN_RATE" in r.stderr


def test_streamed_blobs_follow_auth_and_redirects_and_keep_the_connection(cli, bundle, empty_store, monkeypatch,
                                                                          tmp_path):
    """Every layer streamed (receive.AHEAD_MAX = 0) through a registry that asks for Basic auth
    and redirects each blob to storage on another origin: the pull succeeds, the storage never
    sees the credentials, and each streamed body read to its end leaves its connection for the
    next request (one connection to the storage for all of them)."""
    from slm.ops.ship import receive

    manifest, blobs = bundle
    monkeypatch.setattr(receive, "AHEAD_MAX", 0)
    monkeypatch.setenv("SLM_REGISTRY_AUTH", f"alice:{SECRET}")
    with FakeRegistry(manifest, blobs) as storage:
        with FakeRegistry(manifest, {}, misbehave=blobs_redirected_to(storage), password=basic("alice", SECRET)) as reg:
            r = cli("--store", empty_store, "pull", f"{reg.host}/{REPO}:v1", "--json")
    assert r.code == 0, r.err
    assert r.json()["blobs_downloaded"] == len(blobs) - 1  # every blob but the manifest
    got = [s for s in storage.seen if "/blobs/" in s.path]
    assert len(got) == len(blobs) - 1 and {s.authorization for s in got} == {""}
    assert len({s.client for s in got}) == 1
    assert cli("--store", empty_store, "fsck").code == 0


# ------------------------------------------------------------------ the Docker config file

def _pull_with_config(tmp_path, make_config, reference=f"127.0.0.1:9/{REPO}:v1"):
    """`slm pull` (by default from a port nothing listens on: the credentials are looked up
    before anything is sent) with $HOME/.docker/config.json made by `make_config`:
    (the result, the store, the store's snapshot before)."""
    config = tmp_path / "home" / ".docker" / "config.json"
    config.parent.mkdir(parents=True)
    make_config(config)
    store = tmp_path / "store"
    assert subprocess.run([*SLM, "--store", str(store), "init"], env=child_env(tmp_path),
                          capture_output=True, timeout=HANG).returncode == 0
    before = snapshot(store)
    r = subprocess.run([*SLM, "--store", str(store), "pull", reference], env=child_env(tmp_path),
                       capture_output=True, text=True, timeout=LOOKUP_HANG, stdin=subprocess.DEVNULL)
    return r, store, before


def test_a_fifo_as_docker_config_is_exit_4_not_a_hang(tmp_path):
    """Issue 30: ~/.docker/config.json was read with an unbounded read_bytes(): a FIFO there
    made every push and pull wait for a writer forever."""
    r, store, before = _pull_with_config(tmp_path, os.mkfifo)
    assert r.returncode == 4 and one_line(r.stderr), r.stderr
    assert "config.json is a FIFO, not a regular file" in r.stderr
    assert snapshot(store) == before


def test_an_oversize_docker_config_is_exit_4(tmp_path):
    r, store, before = _pull_with_config(
        tmp_path, lambda p: p.write_bytes(b'{"auths": {}, "pad": "' + b"x" * (2 << 20) + b'"}'))
    assert r.returncode == 4 and one_line(r.stderr), r.stderr
    assert "more than a Docker config file can be (1048576)" in r.stderr
    assert snapshot(store) == before


def test_credentials_from_the_docker_config_are_still_used(bundle, tmp_path):
    """The control: a regular config.json under $HOME gives the registry its credentials."""
    manifest, blobs = bundle
    auth = base64.b64encode(f"alice:{SECRET}".encode()).decode()
    with FakeRegistry(manifest, blobs, password=basic("alice", SECRET)) as reg:
        r, _, _ = _pull_with_config(tmp_path, lambda p: p.write_text(json.dumps({"auths": {reg.host: {"auth": auth}}})),
                                    f"{reg.host}/{REPO}:v1")
    assert r.returncode == 0, r.stderr  # the registry answers 401 to any request without them
    assert basic("alice", SECRET) in {s.authorization for s in reg.seen if "/blobs/" in s.path}
