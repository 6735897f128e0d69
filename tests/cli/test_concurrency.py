"""Concurrent writers are serialised by the store lock; readers never see a torn refs/active."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from slm.store import StoreDir

pytestmark = pytest.mark.slow

WORKERS, EACH = 8, 50

WRITER = textwrap.dedent("""
    import sys
    from slm.ops.store.activation import activate
    from slm.store import StoreDir
    store, worker, each = StoreDir.open(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    for i in range(each):
        # a distinct weight per activation: every one is a real transition
        activate(store, "tq", [f"a1@{(1 + worker * 100 + i) / 1000}"])  # within the weight bound
""")

READER = textwrap.dedent("""
    import sys, time
    from slm.store import StoreDir
    store = StoreDir.open(sys.argv[1])
    reads = 0
    deadline = time.time() + 600
    while time.time() < deadline:  # a hang guard: the test creates stop-reading
        store.active_ref.read()  # raises on a torn or damaged ref
        reads += 1
        if reads == 1:
            print("reading", flush=True)  # the writers start now: the reads overlap them
        if (store.root / "stop-reading").exists():
            break
    print(reads)
""")


def test_eight_writers_fifty_activations_each(cli, store, store_dir, tiny_model, tmp_path):
    import make_random_lora

    lora = make_random_lora.make_random_lora(tmp_path / "lora", rank=2, hidden=64, intermediate=128,
                                             layers=2, kv_dim=32)
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("import", "adapter", lora, "--name", "a1").code == 0
    reader = subprocess.Popen([sys.executable, "-c", READER, str(store_dir)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert reader.stdout.readline() == "reading\n", reader.stderr.read()
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(store_dir), str(w), str(EACH)],
                                stderr=subprocess.PIPE, text=True) for w in range(WORKERS)]
    for w in writers:
        _, err = w.communicate(timeout=900)
        assert w.returncode == 0, err
    (store_dir / "stop-reading").touch()
    reads, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    assert int(reads) > 0
    s = StoreDir.open(store_dir)
    entries = s.reflog.entries()
    assert len(entries) == WORKERS * EACH
    assert [e.seq for e in entries] == list(range(1, WORKERS * EACH + 1))
    assert all(a.new == b.old for a, b in zip(entries, entries[1:])), "each transition starts where the last ended"
    assert s.active_ref.read() == entries[-1].new
    (store_dir / "stop-reading").unlink()
    assert cli("fsck").code == 0


def test_an_activation_does_not_wait_for_a_long_import(tmp_path, tiny_model):
    """An import stages (reads, quantizes, hashes, writes tmp/) without the store lock and takes
    it only to commit: paused at its end of staging, then stopped there (SIGSTOP: it cannot
    move on however long the rest takes), it lets an activation through while the lock
    timeout is 2 s; fsck meanwhile leaves its live staging area alone; once resumed it commits.
    The order is what is checked: the activation and fsck both finish before the import does."""
    import signal
    import subprocess
    import sys

    store = tmp_path / "store"
    slm = [sys.executable, "-m", "slm", "--store", str(store)]
    for args in (["init"], ["import", "base", str(tiny_model["gguf_q"]), "--name", "tq"]):
        subprocess.run([*slm, *args], check=True, capture_output=True)
    config = store / "config.toml"
    config.write_text(config.read_text().replace("lock_timeout_s = 30.0", "lock_timeout_s = 2.0"))
    env = {**os.environ, "SLM_FAULTS": "pause@point=import.staged", "SLM_FAULTS_PAUSE_S": "20"}
    importer = subprocess.Popen([*slm, "import", "base", str(tiny_model["hf"]), "--name", "th", "--quant",
                                 "q4_0"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert "slm-fault paused" in importer.stderr.readline()
        importer.send_signal(signal.SIGSTOP)  # within the pause: it has staged, not committed
        r = subprocess.run([*slm, "activate", "tq"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr  # had the import held the lock: exit 7 after 2 s
        r = subprocess.run([*slm, "fsck"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout  # the live staging area is not junk
        r = subprocess.run([*slm, "ls", "--json"], capture_output=True, text=True, check=True, timeout=600)
        assert "th" not in {e["name"] for e in json.loads(r.stdout)}, "the import committed while stopped"
        importer.send_signal(signal.SIGCONT)
        assert importer.wait(timeout=600) == 0
    finally:
        importer.kill()
        importer.wait()
    r = subprocess.run([*slm, "ls", "--json"], capture_output=True, text=True, check=True)
    assert "th" in {e["name"] for e in json.loads(r.stdout)}
    assert subprocess.run([*slm, "fsck"], capture_output=True).returncode == 0
