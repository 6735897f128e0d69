"""A base's chat template that hangs, or asks for a gigabyte, refuses its own request (400) in
`slm serve`: the template renders in a bounded process, not on the thread that prepares every
request, so the other bases keep answering meanwhile; the server's memory stays its own, and
SIGTERM stops it cleanly."""

from __future__ import annotations

import threading
import time

import pytest

from serve_helpers import Server
from template_fixtures import ATTACKS, hostile_gguf, triggered

pytestmark = pytest.mark.hostile

MIB = 1 << 20


@pytest.fixture
def hostile_store(cli, store, store_dir, tiny_model, tmp_path):
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    for kind, attack in ATTACKS.items():
        path = hostile_gguf(tmp_path / f"{kind}.gguf", add_chat_template=triggered(attack))
        assert cli("import", "base", path, "--name", kind).code == 0
    assert cli("activate", "tq").code == 0
    return store_dir


def _chat(server: Server, model: str, content: str) -> tuple[int, dict]:
    return server.json("POST", "/v1/chat/completions",
                       {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 2})


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def test_a_hostile_template_refuses_its_request_while_other_bases_answer(hostile_store):
    server = Server(hostile_store)
    late = threading.Thread(target=lambda: _chat(server, "hang", "boom"))
    try:
        for model in ("tq", "hang"):  # loaded, and a renderer started
            assert _chat(server, model, "hi")[0] == 200
        for kind in sorted(ATTACKS):
            answers: dict[str, tuple[int, dict]] = {}
            hostile = threading.Thread(target=lambda k=kind: answers.setdefault(k, _chat(server, k, "boom")))
            hostile.start()
            time.sleep(0.5)  # its render under way: the hanging one holds its worker for 2 s
            chat = _chat(server, "tq", "hello")
            completion = server.json("POST", "/v1/completions", {"model": "tq", "prompt": "hi", "max_tokens": 2})
            # both answered while the hanging template's request was still waiting for its render
            if kind == "hang":
                assert kind not in answers
            hostile.join()
            assert chat[0] == 200 and completion[0] == 200, (chat, completion)
            status, body = answers[kind]
            assert status == 400, body
            assert "chat template" in body["error"]["message"], body
        assert _peak_rss(server.proc.pid) < 512 * MIB  # the gigabyte was never asked of this process
        # SIGTERM while a render hangs: a clean exit
        late.start()
        time.sleep(0.5)  # its render under way (the stop is clean at any moment; this is the hard one)
    finally:
        code = server.stop()
    if late.is_alive():
        late.join()
    assert code == 0, server.lines
    assert not any("Traceback" in line or "CancelledError" in line for line in server.lines), server.lines
