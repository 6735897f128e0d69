"""`slm chat` (issue 32) driven through a pseudo-terminal (os.openpty) as a person drives it: turns that
carry the conversation, a /model switch, Ctrl-C during an answer (the answer stops, the chat
goes on), leaving with Ctrl-C twice or Ctrl-D. The expected answers come from slm.Conversation,
the public API the command is a printer over."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import HANG_S, copy_store, tiny_store
from slm.errors import printable

SLM = [sys.executable, "-m", "slm"]
PROMPT = ">>> "
OPTIONS = dict(max_tokens=16)

# A test hook (a sitecustomize module, imported before `-m slm` runs): the answer to the
# message PAUSE_ON waits after its first piece of text until it is cancelled, so that the
# SIGINT the test sends lands while an answer is under way (a state reached, not a guessed time).
PAUSE_HOOK = """
import os, sys
import slm.api
PAUSE_ON, TWICE_ON, COUNT_ON = os.environ["CHAT_PAUSE_ON"], os.environ["CHAT_TWICE_ON"], os.environ["CHAT_COUNT_ON"]
chat = slm.api.Session.chat
def paused_chat(self, messages, max_tokens=128, *, on_text=None, cancel=None, **options):
    if messages[-1].content == COUNT_ON:
        sys.stderr.write(f"[{len(messages)} messages]\\n")
    if messages[-1].content in (PAUSE_ON, TWICE_ON) and on_text is not None and cancel is not None:
        show, waited = on_text, []
        def pause_then_show(piece):
            show(piece)
            if not waited:
                waited.append(True)
                sys.stderr.write("[answer under way]\\n")
                sys.stderr.flush()
                cancel.wait(120)
                if messages[-1].content == TWICE_ON:  # still under way, for a second Ctrl-C
                    cancel.clear()
                    sys.stderr.write("[first Ctrl-C seen]\\n")
                    sys.stderr.flush()
                    cancel.wait(120)
        on_text = pause_then_show
    return chat(self, messages, max_tokens, on_text=on_text, cancel=cancel, **options)
slm.api.Session.chat = paused_chat
"""
PAUSE_ON = "Tell me a long story."
TWICE_ON = "Tell me an even longer story."  # paused until a second Ctrl-C
COUNT_ON = "How long is this conversation?"  # the hook shows how many messages it is sent


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """The tiny base `tq` (with its chat template) active, and a LoRA `a1`."""
    return tiny_store(tmp_path_factory.mktemp("chat"), tiny_model, adapters=1)


@pytest.fixture
def store_dir(template, tmp_path) -> Path:
    return copy_store(template, tmp_path)


class Terminal:
    """`slm chat` on a pseudo-terminal: what it shows is read on a thread into `shown`."""

    def __init__(self, argv: list[str], env: dict):
        master, slave = os.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.master, self.shown, self.seen = master, "", 0
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:  # the child closed the terminal
                data = b""
            with self.changed:
                self.shown += data.decode("utf-8", "replace") if data else ""
                self.closed = not data
                self.changed.notify_all()
            if not data:
                return

    closed = False

    def expect(self, text: str) -> str:
        """Wait until `text` shows after what was expected last; return what came before it
        (terminal line ends as \\n)."""
        deadline = time.monotonic() + HANG_S
        with self.changed:
            while (at := self.shown.find(text, self.seen)) < 0:
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    raise AssertionError(f"{text!r} never showed; the terminal shows:\n{self.shown[self.seen:]!r}")
                self.changed.wait(left)
            before, self.seen = self.shown[self.seen:at], at + len(text)
        return before.replace("\r\n", "\n")

    def type(self, line: str) -> str:
        """Type a line at the prompt; what showed until the next prompt, the echo left out."""
        os.write(self.master, line.encode() + b"\n")
        self.expect(line)
        return self.expect(PROMPT)

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=HANG_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            os.close(self.master)


def _chat(store_dir: Path, tmp_path: Path, *args: str) -> Terminal:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PAUSE_HOOK)
    env = {**os.environ, "CHAT_PAUSE_ON": PAUSE_ON, "CHAT_TWICE_ON": TWICE_ON, "CHAT_COUNT_ON": COUNT_ON,
           "TERM": "dumb",
           "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return Terminal([*SLM, "--store", str(store_dir), "chat", "-n", str(OPTIONS["max_tokens"]), *args], env)


def _shown(text: str) -> str:
    return printable(text, keep="\n\t")


def _answer(shown: str) -> str:
    """The answer in what showed after a question (terminal control sequences left out)."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown).strip("\n")


def test_chat_two_turns_a_model_switch_and_ctrl_c_during_an_answer(store_dir, tmp_path):
    import slm

    # what the API answers, turn by turn, for the same conversation
    rt = slm.Runtime(slm.Store.open(store_dir))
    conv = slm.Conversation(rt, "tq", system="Be brief.", **OPTIONS)
    first = conv.ask("Once upon a time").text
    second = conv.ask("And then?").text
    alone = slm.Conversation(rt, "tq", system="Be brief.", **OPTIONS).ask("And then?").text
    assert second != alone  # the second answer depends on the first turn: the history counts
    conv.switch("tq+a1@0.5")
    third = conv.ask("What next?").text
    fresh = slm.Conversation(rt, "tq+a1@0.5", system="Be brief.", **OPTIONS).ask("Once upon a time").text

    term = _chat(store_dir, tmp_path, "tq", "--system", "Be brief.")
    try:
        term.expect(PROMPT)
        assert _answer(term.type("Once upon a time")) == _shown(first)
        assert _answer(term.type("And then?")) == _shown(second)
        switched = term.type("/model tq+a1@0.5")
        assert "now answering from tq+a1@0.5" in switched
        assert _answer(term.type("What next?")) == _shown(third)
        # Ctrl-C while an answer is being written: that answer stops, the chat goes on
        os.write(term.master, PAUSE_ON.encode() + b"\n")
        term.expect("[answer under way]")
        term.proc.send_signal(signal.SIGINT)
        assert "(stopped)" in term.expect(PROMPT)
        assert term.proc.poll() is None
        assert "conversation cleared" in term.type("/reset")
        assert _answer(term.type("Once upon a time")) == _shown(fresh)
        # Ctrl-C at the prompt says how to leave; a second one in a row leaves, exit 0
        term.proc.send_signal(signal.SIGINT)
        term.expect("Ctrl-C again or Ctrl-D to leave")
        term.expect(PROMPT)  # back at the prompt: the second Ctrl-C is the user's next keypress
        term.proc.send_signal(signal.SIGINT)
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    assert "Traceback" not in term.shown and "slm: error" not in term.shown


@pytest.mark.hostile
def test_ctrl_c_twice_during_an_answer_stops_it_and_keeps_the_chat_and_its_turns(store_dir, tmp_path):
    """Issue 45: the second Ctrl-C during one answer ended the chat (exit, the conversation
    lost). Every Ctrl-C during an answer only stops it; the turns stay; a Ctrl-C at the prompt
    after it is the first of two, not the second."""
    term = _chat(store_dir, tmp_path, "tq", "--system", "Be brief.")
    try:
        term.expect(PROMPT)
        assert _answer(term.type("Once upon a time"))
        os.write(term.master, TWICE_ON.encode() + b"\n")
        term.expect("[answer under way]")
        term.proc.send_signal(signal.SIGINT)
        term.expect("[first Ctrl-C seen]")  # the answer goes on, waiting for another
        term.proc.send_signal(signal.SIGINT)
        assert "(stopped)" in term.expect(PROMPT)
        assert term.proc.poll() is None
        # the system message, two questions and their answers (the stopped one as far as it got), this one
        assert "[6 messages]" in term.type(COUNT_ON)
        term.proc.send_signal(signal.SIGINT)
        term.expect("Ctrl-C again or Ctrl-D to leave")
        term.expect(PROMPT)
        assert "[8 messages]" in term.type(COUNT_ON)  # typing on: that Ctrl-C did not end the chat
        term.proc.send_signal(signal.SIGINT)
        term.expect("Ctrl-C again or Ctrl-D to leave")
        term.proc.send_signal(signal.SIGINT)
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    assert "Traceback" not in term.shown and "slm: error" not in term.shown


def test_chat_leaves_on_ctrl_d_and_reports_a_bad_model_without_ending(store_dir, tmp_path):
    term = _chat(store_dir, tmp_path)
    try:
        term.expect(PROMPT)
        assert "slm: error: no composition, tag or base named 'nosuch'" in term.type("/model nosuch")
        assert "slm: error: unknown command /nope" in term.type("/nope")
        assert _answer(term.type("Once upon a time"))  # still answering from the active composition
        os.write(term.master, b"\x04")  # Ctrl-D at the start of a line: end of input
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()


def test_chat_refuses_a_bad_spec_or_option_before_it_starts(store_dir):
    for args, code, message in [(["nosuch+a1"], 3, "no base named 'nosuch'"),
                                (["--top-k", "-1"], 4, "top_k must be"),
                                (["--stop", ""], 4, "1 to 256 characters")]:
        r = subprocess.run([*SLM, "--store", str(store_dir), "chat", *args], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=HANG_S)
        assert (r.returncode, r.stdout) == (code, ""), r.stderr
        assert r.stderr.startswith("slm: error: ") and message in r.stderr and r.stderr.count("\n") == 1


def test_conversation_keeps_a_stopped_answer_as_far_as_it_went(store_dir):
    """cancel() from another thread ends the answer at its next token; the turn joins the
    history with what was said."""
    import slm

    conv = slm.Conversation(slm.Runtime(slm.Store.open(store_dir)), "tq", max_tokens=64)
    pieces: list[str] = []

    def cancel_after_the_first_piece(piece: str) -> None:
        pieces.append(piece)
        conv.cancel()

    answer = conv.ask("Once upon a time", on_text=cancel_after_the_first_piece)
    assert answer.stop_reason == "cancelled" and len(answer.tokens) < 64
    assert [m.role for m in conv.history] == ["user", "assistant"]
    assert conv.history[1].content == answer.text and answer.text.startswith(pieces[0])
    conv.reset()
    assert conv.history == [] and conv.ask("Once upon a time").stop_reason != "cancelled"


def test_chat_from_a_pipe_leaves_on_two_ctrl_c_while_a_line_is_being_read(store_dir):
    """Lines are read on a thread of their own, which is still waiting for one when two Ctrl-C
    end the chat: from a pipe that thread must hold no lock the interpreter's shutdown takes
    (Python's buffered stdin's did: 'Fatal Python error', exit 134)."""
    proc = subprocess.Popen([*SLM, "--store", str(store_dir), "chat", "-n", "4"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.read(len(PROMPT)) == PROMPT.encode()  # the prompt: the line is being read
        proc.send_signal(signal.SIGINT)
        notice = b""
        while b"Ctrl-C again" not in notice:
            more = proc.stderr.read1(4096)
            assert more, f"the chat ended without the notice: {notice!r}"
            notice += more
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=HANG_S) == 0
        assert b"Fatal" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdin.close()
