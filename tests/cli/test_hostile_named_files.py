"""Files an operator names, read through the bounded reader (issue 45): `slm activate -f FIFO`
and `slm run --json-schema FIFO` waited for ever for a writer; a pipe that never ends waited
for ever too. Now a pipe (`<(...)`) is read within slm.formats.untrusted.PIPE_WAIT_S and
refused (exit 4, one line, the store unchanged) past it; one that sends its document works."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from helpers import copy_store, one_line, snapshot, tiny_store

pytestmark = pytest.mark.hostile

WAIT = 120  # seconds: a bound that turns a hang into a failure on a loaded machine, never a timing


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("named"), tiny_model)


@pytest.fixture
def store_dir(template, tmp_path, monkeypatch):
    from slm.formats import untrusted

    monkeypatch.setattr(untrusted, "PIPE_WAIT_S", 1.0, raising=False)  # (raising: the old code had none)
    return copy_store(template, tmp_path)


def _in_thread(cli, args, release) -> object:
    """cli(*args) on a thread; if it is still running after WAIT, `release()` unblocks it and
    the test fails (it waited on the pipe)."""
    result = []
    worker = threading.Thread(target=lambda: result.append(cli(*args)), daemon=True)
    worker.start()
    worker.join(WAIT)
    if worker.is_alive():
        release()
        worker.join(WAIT)
        pytest.fail(f"slm {' '.join(map(str, args))} waited on a pipe for over {WAIT} s")
    return result[0]


def _manifest(cli, store_dir) -> str:
    active = cli("--store", store_dir, "status", "--json")
    return json.loads(cli("--store", store_dir, "show", json.loads(active.out)["active"]["id"], "--json").out
                      )["manifest_toml"]


COMMANDS = {"activate": ("activate", "-f"), "run": ("run", "hi", "-n", "2", "--json-schema")}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_fifo_nothing_writes_to_is_refused_not_waited_on(cli, store_dir, tmp_path, command):
    fifo = tmp_path / "named.fifo"
    os.mkfifo(fifo)

    def release():  # a writer that comes and goes: the old code's blocked open returns
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    before = snapshot(store_dir)
    r = _in_thread(cli, ["--store", store_dir, *COMMANDS[command], fifo], release)
    assert r.code == 4 and one_line(r.err) and "pipe" in r.err, r.err
    assert snapshot(store_dir) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_a_pipe_that_never_ends_is_refused_at_its_deadline(cli, store_dir, command):
    read, write = os.pipe()
    os.write(write, b"[")  # a start, and then nothing: the writer holds the pipe open
    released = []

    def release():
        released.append(True)
        os.close(write)

    try:
        before = snapshot(store_dir)
        r = _in_thread(cli, ["--store", store_dir, *COMMANDS[command], f"/dev/fd/{read}"], release)
        assert r.code == 4 and one_line(r.err) and "pipe" in r.err, r.err
        assert snapshot(store_dir) == before
    finally:
        os.close(read)
        if not released:
            os.close(write)


def test_a_pipe_that_sends_its_document_is_read(cli, store_dir):
    """`slm activate -f <(...)` and `slm run --json-schema <(...)`: a pipe that sends all of
    itself before the deadline is as good as a file."""
    active = json.loads(cli("--store", store_dir, "status", "--json").out)["active"]["id"]
    for args, text in (((*COMMANDS["activate"],), _manifest(cli, store_dir)),
                       ((*COMMANDS["run"],), '{"type": "object"}')):
        read, write = os.pipe()
        writer = threading.Thread(target=lambda w=write, t=text: (os.write(w, t.encode()), os.close(w)))
        writer.start()
        try:
            r = _in_thread(cli, ["--store", store_dir, *args, f"/dev/fd/{read}"], lambda: None)
        finally:
            writer.join(WAIT)
            os.close(read)
        assert r.code == 0, r.err
    assert json.loads(cli("--store", store_dir, "status", "--json").out)["active"]["id"] == active


def test_a_checkpoints_chat_template_file_goes_through_the_bounded_reader(cli, store_dir, tiny_model, tmp_path):
    """chat_template.jinja beside an HF checkpoint: a FIFO in its place is refused (exit 4) at
    once, not skipped as if absent; a regular one is read (its template is the base's)."""
    import shutil

    hf = Path(shutil.copytree(tiny_model["hf"], tmp_path / "hf"))
    os.mkfifo(hf / "chat_template.jinja")
    before = snapshot(store_dir)
    r = _in_thread(cli, ["--store", store_dir, "import", "base", hf, "--name", "th"], lambda: None)
    assert r.code == 4 and one_line(r.err) and "FIFO" in r.err, r.err
    assert snapshot(store_dir) == before
    (hf / "chat_template.jinja").unlink()
    (hf / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    assert cli("--store", store_dir, "import", "base", hf, "--name", "th").code == 0
    from slm.store import StoreDir

    tokenizer = json.loads(cli("--store", store_dir, "show", "th", "--json").out)["tokenizer"]["digest"]
    doc = json.loads(StoreDir.open(store_dir).objects.read_verified(tokenizer))
    assert doc["config"]["chat_template"] == "{% for m in messages %}[{{ m.content }}]{% endfor %}"
