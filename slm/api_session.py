"""A Session: generation on one composition, start to finish (slm.api.Runtime.session makes
them; `slm.Session` is this class). Kept apart from slm.api so that each stays one reader's
length; it belongs to the same public boundary."""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

if TYPE_CHECKING:
    import numpy as np

    from slm.api import Runtime
    from slm.ops.infer.loading import Loaded
    from slm.engine.request import ChatMessage, ResponseFormat, Tools
    from slm.ops.results import Generation
    from slm.ops.infer.run import RunOptions
    from slm.store import StoreDir


class Session:
    """Generation on one composition, start to finish (it never changes under a session)."""

    def __init__(self, runtime: Runtime, loaded: Loaded, store: StoreDir) -> None:
        self.runtime = runtime
        self._loaded = loaded
        self._store = store  # the runtime's store, as the operations take it

    @property
    def composition_id(self) -> str:
        return self._loaded.id

    def _options(self, **fields: object) -> RunOptions:
        """The run options of a GenerationRequest made of `fields` (checked as it is made)."""
        from slm.engine.request import GenerationRequest
        from slm.model import modes
        from slm.ops.infer.run import RunOptions

        return RunOptions(GenerationRequest(**fields), threads=self.runtime.threads,
                          exact=self.runtime.mode == modes.EXACT)

    def generate(self, prompt: str, max_tokens: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None, chat: bool = False, *, top_k: int = 0, min_p: float = 0.0,
                 repeat_penalty: float = 1.0, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
                 response_format: dict | ResponseFormat | None = None, system: str | None = None,
                 stop: str | Sequence[str] | None = (), **vllm_options: object) -> Generation:
        """max_tokens None: 128, or what the context leaves (more than it leaves: InvalidInput); seed None:
        a fresh random seed (Generation.seed); chat: the prompt in the base's chat template, after `system`
        if given (implies chat); stop: a stop sequence or up to 4 of them; logprobs k: each token's logprob and its k
        likeliest alternatives (docs/api.md); response_format: OpenAI's object or a ResponseFormat;
        vllm_options: GenerationRequest's options of vLLM's (min_tokens, ignore_eos, ...)."""
        from slm.ops.infer import run

        options = self._options(response_format=response_format, prompt=prompt, max_tokens=max_tokens,
                                temperature=temperature,
                                top_p=top_p, seed=seed, chat=chat, top_k=top_k, min_p=min_p,
                                repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, logit_bias=logit_bias, logprobs=logprobs,
                                system=system, stop=stop, **vllm_options)
        return run.generate_on(self._store, self._loaded, options)[0]

    def chat(self, messages: Sequence[ChatMessage | dict], max_tokens: int | None = None, *,
             on_text: Callable[[str], None] | None = None, cancel: threading.Event | None = None,
             tools: Tools | None = None, **options: object) -> Generation:
        """The next answer to a conversation (ChatMessage or {"role", "content"} dicts, oldest
        first) in the base's chat template, with generate's keyword options. on_text(piece): the
        answer as it decodes; cancel: an Event that, once set, ends it (stop_reason "cancelled");
        tools: the functions it may call (Tools.of(OpenAI's tools, tool_choice)): the calls it
        makes are the Generation's tool_calls, its text the rest."""
        from slm.ops.infer import run

        o = self._options(messages=tuple(messages), max_tokens=max_tokens, tools=tools, **options)
        return run.generate_on(self._store, self._loaded, o, on_text=on_text, cancel=cancel)[0]

    def generate_choices(self, prompt: str, n: int, max_tokens: int | None = None, temperature: float = 0.0,
                         top_p: float = 1.0, seed: int | None = None, chat: bool = False,
                         **options: object) -> list[Generation]:
        """The server's n choices of one prompt: choice i is generate's answer with seed s + i, or a fresh seed."""
        from slm.engine.sampling import check_processing as check, choice_seeds

        check(n=n)
        return [self.generate(prompt, max_tokens, temperature, top_p, s, chat, **options) for s in choice_seeds(seed, n)]

    def stream(self, prompt: str, max_tokens: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
               seed: int | None = None, chat: bool = False, response_format: dict | ResponseFormat | None = None,
               **sampling: object) -> Iterator[str]:
        """The text in pieces as they decode (generate's options); closing the iterator ends the generation."""
        from slm.ops.infer import run

        pieces: queue.Queue = queue.Queue()
        options = self._options(response_format=response_format, prompt=prompt, max_tokens=max_tokens,
                                temperature=temperature, top_p=top_p, seed=seed, chat=chat, **sampling)
        failure: list[BaseException] = []
        cancel = threading.Event()  # set when the consumer stops early: the worker stops at its next token

        def work() -> None:
            try:
                run.generate_on(self._store, self._loaded, options, on_text=pieces.put, cancel=cancel)
            except BaseException as err:  # handed to the consumer below
                failure.append(err)
            finally:
                pieces.put(None)

        worker = threading.Thread(target=work, name="slm-session-stream", daemon=True)
        worker.start()
        try:
            while (piece := pieces.get()) is not None:
                yield piece
        finally:
            cancel.set()
            worker.join()
        if failure:
            raise failure[0]

    def logits(self, token_ids: Sequence[int], prompt_length: int | None = None) -> np.ndarray:
        """Float32 logits (positions x vocab) of a token sequence, computed from scratch as generate
        computes them: ids[:prompt_length] (default: all) as a prompt, the rest one step a token."""
        from slm.ops.infer import run

        return run.logits_of(self._loaded, token_ids, self.runtime.mode, prompt_length)
