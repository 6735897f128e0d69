"""A multi-turn conversation on the public API (`slm chat`, or any program that embeds slm):
the history in memory, the base's chat template (Session.chat), switching the composition
mid-conversation, and stopping an answer without ending the conversation.

    conv = slm.Conversation(slm.Runtime(store), "smol+french@0.8", system="Be brief.")
    answer = conv.ask("Bonjour !", on_text=print)   # -> Generation; the turn joins the history
    conv.switch("smol")                             # the next answers come from another composition
    conv.reset()                                    # forget the turns (the system message stays)

`conv.loop(read_line, view)` is `slm chat`'s read-answer loop, with the commands /reset,
/model SPEC, /help and /exit; it reads lines and reports to a view (slm.render.ChatPrinter), so
it prints nothing itself. Like the server, this module uses only what `slm` and `slm.api` offer.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

from slm import Generation, SlmError
from slm.api import ChatMessage, Runtime, check_processing, check_sampling, short_digest

COMMANDS = "/reset (forget the conversation), /model SPEC (switch composition), /help, /exit"
# How long the asking thread waits at a time. It waits in slices because a signal that lands
# just before a blocking wait begins is seen only when that wait ends: in slices, within POLL_S.
POLL_S = 0.1
INTERRUPT = ("interrupt", None)


class Conversation:
    """One conversation on one Runtime: the turns so far, the composition they go to, and the
    options of every answer (Session.chat's: max_tokens, temperature, top_p, seed, top_k, min_p,
    stop, and in `options` the penalties), checked here."""

    def __init__(self, runtime: Runtime, spec: str | None = None, system: str | None = None, *,
                 max_tokens: int = 512, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                 top_k: int = 0, min_p: float = 0.0, stop: str | tuple[str, ...] | None = (), **options: object) -> None:
        # the options are checked now, before a composition is staged: not at the first question
        check_sampling(temperature, top_p, seed)
        check_processing(top_k=top_k, min_p=min_p, stop=stop, **options)
        self.runtime = runtime
        self.system = system
        self.options = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, top_k=top_k,
                            min_p=min_p, stop=stop, **options)
        self.history: list[ChatMessage] = []
        self.session = runtime.session(spec)  # None: the active composition (staged now: a bad spec fails here)
        self._cancel = threading.Event()
        # what the asking thread waits for: ("answer", (turn, outcome)) from an answer's worker,
        # ("line", text or the read's exception) from loop()'s reader, INTERRUPT from loop()'s
        # SIGINT handler (a SimpleQueue: its put may interrupt a get in the same thread safely)
        self._events: queue.SimpleQueue = queue.SimpleQueue()

    @property
    def composition_id(self) -> str:
        return self.session.composition_id

    def messages(self, text: str) -> list[ChatMessage]:
        """What the next answer is generated from: the system message, the history, `text`."""
        system = [ChatMessage("system", self.system)] if self.system else []
        return [*system, *self.history, ChatMessage("user", text)]

    def ask(self, text: str, on_text: Callable[[str], None] | None = None) -> Generation:
        """The answer to `text` (streamed to on_text as it decodes); the question and the answer
        join the history. Ctrl-C while it generates (any number of them), or cancel() from
        another thread, ends the answer at the next token or prompt chunk (stop_reason
        "cancelled"): what was said so far is the answer kept. The generation runs on a worker
        thread, so an interrupt lands here and never inside the model's arithmetic."""
        self._cancel.clear()
        messages = self.messages(text)
        turn = object()  # (an answer of an earlier turn, abandoned to an exception, is not this one)

        def work() -> None:
            outcome: object = None
            try:
                outcome = self.session.chat(messages, on_text=on_text, cancel=self._cancel, **self.options)
            except BaseException as err:  # handed to the asking thread below
                outcome = err
            finally:
                self._events.put(("answer", (turn, outcome)))

        threading.Thread(target=work, name="slm-chat-answer", daemon=True).start()
        try:
            while True:
                kind, value = self._next_event()
                if kind == "interrupt":
                    self.cancel()
                elif kind == "answer" and value[0] is turn:
                    result = value[1]
                    break
        except BaseException:  # (a KeyboardInterrupt outside the wait itself) the answer stops too
            self.cancel()
            raise
        if isinstance(result, BaseException):
            raise result
        self.history += [ChatMessage("user", text), ChatMessage("assistant", result.text)]
        return result

    def _next_event(self) -> tuple[str, object]:
        """The asking thread's next event; a KeyboardInterrupt while it waits (Python's own SIGINT
        handler, outside loop()) is INTERRUPT."""
        while True:
            try:
                return self._events.get(timeout=POLL_S)
            except queue.Empty:
                continue
            except KeyboardInterrupt:
                return INTERRUPT

    def cancel(self) -> None:
        """End the answer being generated at its next token or prompt chunk (from any thread)."""
        self._cancel.set()

    def reset(self) -> None:
        """Forget the turns; the system message and the composition stay."""
        self.history.clear()

    def switch(self, spec: str) -> None:
        """Send the next answers to another composition (a spec, staged now: on an error the
        conversation keeps the one it had). The history goes on with it."""
        self.session = self.runtime.session(spec)

    def loop(self, read_line: Callable[[], str], view: ChatView) -> None:
        """Read lines until /exit, end of input (Ctrl-D, EOFError) or a second Ctrl-C in a row
        outside an answer; answer each question (Ctrl-C during an answer stops that answer only).
        An error (a bad /model spec, a conversation past the context) is reported to the view
        and the conversation goes on.

        One design for Ctrl-C, so that none is lost or counted twice whatever the moment: from
        the main thread, loop() replaces SIGINT's handler with one that only posts INTERRUPT to
        the asking thread's events (it never raises in the middle of anything), and lines are
        read on a thread of their own, so that the asking thread only ever waits for events.
        An INTERRUPT during an answer cancels it; any other is one Ctrl-C at the prompt, which
        the view is told of before it shows the prompt again (the pending read goes on)."""
        reader = _LineReader(read_line, self._events)
        interrupted = False
        with self._interrupts_posted():
            while True:
                reader.want_line()
                kind, value = self._next_event()
                if kind == "interrupt":
                    if interrupted:
                        return
                    interrupted = True
                    view.notice("(Ctrl-C again or Ctrl-D to leave; /help lists the commands)")
                    view.prompt_again()
                    continue
                if kind != "line":
                    continue  # (an answer abandoned to an exception: nobody waits for it)
                reader.got_line()
                if isinstance(value, BaseException):
                    if isinstance(value, EOFError):
                        return
                    raise value
                interrupted = False
                command = parse(value)
                if command.name == "exit":
                    return
                try:
                    _run(self, command, view)
                except SlmError as err:
                    view.error(str(err))

    @contextlib.contextmanager
    def _interrupts_posted(self) -> Iterator[None]:
        """SIGINT posts INTERRUPT while the block runs (from the main thread; elsewhere a
        signal handler cannot be set, and the caller's own handling stays)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, lambda signum, frame: self._events.put(INTERRUPT))
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
            while not self._events.empty():  # (a Ctrl-C left over must not stop a later ask)
                self._events.get_nowait()


class _LineReader:
    """read_line() on a thread of its own, one line when the loop wants one, each posted as
    ("line", text), or ("line", the exception) for end of input or a failed read."""

    def __init__(self, read_line: Callable[[], str], events: queue.SimpleQueue):
        self._read_line, self._events = read_line, events
        self._wanted = threading.Semaphore(0)
        self._pending = False  # a line was asked for and has not come yet
        threading.Thread(target=self._serve, name="slm-chat-input", daemon=True).start()

    def want_line(self) -> None:
        if not self._pending:
            self._pending = True
            self._wanted.release()

    def got_line(self) -> None:
        self._pending = False

    def _serve(self) -> None:
        while True:
            self._wanted.acquire()
            try:
                line: object = self._read_line()
            except BaseException as err:  # EOFError above all: handed to the loop
                line = err
            self._events.put(("line", line))


class ChatView(Protocol):
    """What loop() reports to (slm.render's chat printer)."""

    def text(self, piece: str) -> None: ...

    def answered(self, generation: Generation) -> None: ...

    def notice(self, message: str) -> None: ...

    def prompt_again(self) -> None: ...  # after a notice, while the line is still being read

    def error(self, message: str) -> None: ...


@dataclass
class Command:
    name: str  # "ask", "reset", "model", "help", "exit", "unknown", "none" (an empty line)
    argument: str = ""


def parse(line: str) -> Command:
    """A line typed at the prompt: a question, or one of the commands."""
    text = line.strip()
    if not text:
        return Command("none")
    if not text.startswith("/"):
        return Command("ask", line)
    word, _, argument = text.partition(" ")
    name = {"/reset": "reset", "/model": "model", "/help": "help", "/exit": "exit", "/quit": "exit",
            "/bye": "exit"}.get(word, "unknown")
    return Command(name, argument.strip() if name != "unknown" else word)


def _run(conv: Conversation, command: Command, view: ChatView) -> None:
    if command.name == "ask":
        answer = conv.ask(command.argument, on_text=view.text)
        view.answered(answer)
    elif command.name == "reset":
        conv.reset()
        view.notice("(conversation cleared)")
    elif command.name == "model":
        if not command.argument:
            view.error("/model takes a composition spec: @active, an id, or BASE+ADAPTER@W+...")
            return
        conv.switch(command.argument)
        view.notice(f"(now answering from {command.argument}: {short_digest(conv.composition_id)})")
    elif command.name == "help":
        view.notice(COMMANDS)
    elif command.name == "unknown":
        view.error(f"unknown command {command.argument}; the commands: {COMMANDS}")

