"""`slm run`: generate text on the active composition, or on a base alone."""

from __future__ import annotations

import numbers
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from slm.errors import InvalidInput, SlmError, UsageError
from slm.model import modes
from slm.engine.generate import drive, sequence_logits
from slm.engine.prepare import prepare
from slm.engine.request import GenerationRequest, ResponseFormat, Tools
from slm.engine.stops import CANCELLED, SWITCHED
from slm.engine.structured import tool_answer
from slm.ops.infer import budget, compositions
from slm.ops.infer.loading import Loaded, load_composition
from slm.ops.results import Alternative, CompositionInfo, Generation, Timings, TokenLogprobs
from slm.ops.infer.prefix_cache import DiskPromptCache, budget_of
from slm.store import StoreDir, outputs


MAX_THREADS = 256


@dataclass
class RunOptions:
    """`slm run`'s options beside its GenerationRequest: which composition, where the logits
    go, the memory budget, what a switch of refs/active does, the kernels' threads and numerics,
    and the files --json-schema and --tools name (read into the request before the model loads)."""

    request: GenerationRequest
    base: str | None = None  # None: the active composition (or `model`)
    model: str | None = None  # a composition spec (slm.ops.store.specs), run without activating it
    logits_out: Path | None = None
    memory_budget: str | None = None
    on_switch: str = "stop"  # or "finish": what to do if refs/active changes mid-generation
    threads: int | None = None  # None: every core
    exact: bool = False  # float32 products (slm.model.modes); the default is int8 where the kernels have it
    json_schema: Path | None = None  # --json-schema FILE: read into the request's response_format
    tools: Path | None = None  # --tools FILE: read into the request's tools (a chat)
    tool_choice: str | None = None  # --tool-choice: none, auto, required or a function's name


def prompt_from_stdin(stream) -> str:
    """`slm run -`: the prompt from standard input, strictly UTF-8."""
    data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read()
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidInput(f"the prompt on standard input is not UTF-8 text (byte {err.start})") from err


def _check_options(o: RunOptions) -> None:
    """What is not the request's (the request checked itself when it was made)."""
    if not isinstance(o.request, GenerationRequest):
        raise InvalidInput("a run needs a GenerationRequest")
    if o.request.n != 1:
        raise InvalidInput(f"n is {o.request.n}: a run generates one choice")
    if o.on_switch not in ("stop", "finish"):
        raise InvalidInput("--on-switch must be 'stop' or 'finish'")
    if o.tool_choice is not None and o.tools is None:
        raise InvalidInput("--tool-choice needs --tools")
    check_threads(o.threads)
    modes.resolve(o.exact)


def _whole(value) -> bool:
    """An integer, not a bool (True is an Integral) nor a float."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_threads(threads: int | None) -> None:
    """The kernels' thread count: None (every core) or a whole number in [1, MAX_THREADS]."""
    if threads is not None and not (_whole(threads) and 1 <= threads <= MAX_THREADS):
        raise InvalidInput(f"--threads must be between 1 and {MAX_THREADS}")


class LogitsFile:
    """--logits-out: the guarded output path (slm.store.outputs): refused inside the store,
    written to a temporary beside the target, fsynced and renamed over it only when the run
    succeeds, so a failing run leaves the target as it was (a user's file is never truncated or
    deleted). The temporary is created before the long part, so an unwritable place fails fast.
    An existing regular file is replaced (the file a symlink there names)."""

    def __init__(self, target: Path, store_root: Path):
        self.out = outputs.OutputFile(Path(target), store_root, "--logits-out", replace=True)

    def commit(self, logits: np.ndarray) -> None:
        with self.out:
            np.save(self.out, logits)
            self.out.commit()

    def discard(self) -> None:
        if not self.out.committed:
            self.out.discard()


def run_prompt(store: StoreDir, o: RunOptions, on_text: Callable[[str], None] | None = None) -> Generation:
    _check_options(o)
    if o.json_schema is not None:  # (before the model loads: a bad file is a fast refusal)
        o = replace(o, request=replace(o.request, response_format=ResponseFormat.from_file(o.json_schema)),
                    json_schema=None)
    if o.tools is not None:
        o = replace(o, request=replace(o.request, chat=True, tools=Tools.from_file(o.tools, o.tool_choice)),
                    tools=None, tool_choice=None)
    out_file = LogitsFile(o.logits_out, store.root) if o.logits_out else None
    try:
        # overflow shows as non-finite logits, refused with exit 10: no NumPy warnings on stderr
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return _run(store, o, on_text, out_file)
    except BaseException:
        if out_file:
            out_file.discard()
        raise


def _run(store: StoreDir, o: RunOptions, on_text, out_file: LogitsFile | None) -> Generation:
    if o.base is not None and o.model is not None:
        raise UsageError("give --base or --model, not both")
    if o.model is not None:  # run without activating: staged as activate checks it, refs/active untouched
        from slm.ops.store import specs

        comp = specs.resolve(store, o.model)
    elif o.base is not None:
        comp = compositions.build(store, o.base, [])
    else:
        comp = compositions.load_active(store, "run `slm activate BASE [ADAPTER...]`, or pass --model SPEC")
    loaded = load_composition(store, comp)
    # Generation is pinned to the composition it started on. When running the active one,
    # each token boundary checks refs/active; a switch stops generation unless told to finish.
    watch = o.base is None and o.model is None and o.on_switch == "stop"
    result, logits = generate_on(store, loaded, o, on_text, keep_logits=out_file is not None, watch=watch,
                                 encode_once=True)
    if out_file:
        out_file.commit(logits)
        result = replace(result, logits_out=str(o.logits_out))
    return result


def generate_on(store: StoreDir, loaded: Loaded, o: RunOptions, on_text=None, keep_logits: bool = False,
                watch: bool = False, encode_once: bool = False,
                cancel: threading.Event | None = None) -> tuple[Generation, np.ndarray | None]:
    """Generate on a loaded composition: `slm run` and the API's sessions share this, a batch
    of one prepared and driven as the server's scheduler prepares and drives its requests
    (slm.engine.prepare, slm.engine.generate.drive).

    Returns the result and, with keep_logits, the float32 logits (positions x vocab) of every
    prompt and generated position. watch: stop at a token boundary once refs/active no longer
    names this composition. cancel: once set (by any thread), stop at the next token boundary
    or, during the prompt's prefill, before its next chunk ("cancelled"). encode_once: `loaded` serves this generation only (slm run), so its
    tokenizer keeps only what decoding needs once the prompt is encoded (release_encoder).
    """
    _check_options(o)
    model = loaded.model
    mode = modes.resolve(o.exact)
    with model.kernels.lock:  # (another thread's forward pass may be using the kernel set)
        if o.threads is not None:
            model.kernels.set_threads(o.threads)  # OpenMP threads: this thread's own setting
        modes.use(model.kernels, mode)
    prepared = prepare(loaded, o.request, mode=mode, memory_budget=budget.resolve(store, o.memory_budget),
                       keep_logits=keep_logits, encode_once=encode_once)
    prompt_cache = DiskPromptCache(store.path("cache"), budget_of(store.config), mode)

    def on_token(token: int) -> str | None:
        if cancel is not None and cancel.is_set():
            return CANCELLED
        return SWITCHED if watch and _switched(store, loaded.id) else None

    emit = on_text or (lambda piece: None)
    gate = prepared.tool_gate(emit)  # (with tools: prose streams, calls are read whole)
    seq = prepared.sequence(prepared.choices[0], on_text=on_text if gate is None else gate.push, caller=on_token,
                            keep_logits=keep_logits)
    gen = drive(seq, prompt_cache, loaded.id, cancelled=None if cancel is None else cancel.is_set)
    tok = loaded.tokenizer
    text = gen.text or ""  # (what the stop rules kept: up to a stop, special tokens as the request asked)
    calls: tuple = ()
    if gate is not None:  # the text outside the calls (its rest streamed now), and the calls
        content, calls = tool_answer(loaded, text)
        text = content or ""
        if rest := gate.rest(content):
            emit(rest)
    comp = loaded.composition
    result = Generation(
        composition=loaded.id,
        base=comp.base,
        adapters=CompositionInfo.of(comp).adapters,
        prefix_cache="hit" if gen.prefix_hit else "damaged" if prompt_cache.damaged else "miss",
        prompt_tokens=prepared.prompt_ids,
        tokens=tuple(gen.ids),
        text=text,
        stop_reason=gen.stop_reason,
        timings=Timings(round(gen.prefill_s, 4), round(gen.decode_s, 4), round(gen.prefill_tok_s, 2),
                        round(gen.decode_tok_s, 2)),
        memory_estimate=prepared.estimate.to_json(),
        seed=prepared.choices[0].seed,
        logprobs=None if o.request.logprobs is None else tuple(logprob_view(tok, r, not o.request.skip_special_tokens)
                                                                     for r in gen.logprobs),
        mode=mode,
        tool_calls=calls,
    )
    logits = np.stack(gen.logits).astype(np.float32) if keep_logits else None  # (positions, vocab)
    return result, logits


def logprob_view(tok, record, special: bool = False) -> TokenLogprobs:
    """A slm.engine.generation.TokenLogprob with the tokens' texts (the API's and `--json`'s);
    special: a special token's text is its own, as in an answer that keeps them
    (skip_special_tokens false), else empty, as in one that leaves them out."""
    text = lambda t: tok.decode([t], special=special)  # noqa: E731
    return TokenLogprobs(record.token, text(record.token), record.logprob,
                         tuple(Alternative(t, text(t), lp) for t, lp in record.top))


def _switched(store: StoreDir, pinned: str) -> bool:
    try:
        return store.active_ref.read() != pinned
    except SlmError:  # a ref we cannot read (damaged, replaced) is not the one we pinned
        return True


def logits_of(loaded: Loaded, token_ids, mode: str, prompt_length: int | None = None) -> np.ndarray:
    """Float32 logits (positions x vocab) of a token sequence, computed from scratch in `mode`
    (slm.model.modes; the API's Session.logits) as a generation computes them
    (slm.engine.generate.sequence_logits: the first prompt_length ids, all by default, as its
    prompt, the rest as its answer): the ids checked first (integers, in the vocabulary, within
    the context; prompt_length 1..len)."""
    model = loaded.model
    with model.kernels.lock:  # (another thread's forward pass may be using the kernel set)
        modes.use(model.kernels, mode)
    values = list(token_ids)
    if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in values):
        raise InvalidInput("logits needs token ids (integers)")
    try:
        ids = np.asarray(values, dtype=np.int64)
    except OverflowError as err:
        raise InvalidInput("a token id is beyond int64") from err
    if ids.ndim != 1 or ids.size == 0:
        raise InvalidInput("logits needs a non-empty sequence of token ids")
    vocab, context = model.cfg.vocab_size, model.cfg.context_length
    if ids.min() < 0 or ids.max() >= vocab:  # a negative id would index from the end
        raise InvalidInput(f"token ids must be in [0, {vocab}); got {int(ids.min())}..{int(ids.max())}")
    if ids.size > context:
        raise InvalidInput(f"{ids.size} token ids; the context holds {context}")
    if prompt_length is not None and (isinstance(prompt_length, bool) or not isinstance(prompt_length, numbers.Integral)
                                      or not 1 <= prompt_length <= ids.size):
        raise InvalidInput(f"prompt_length must be an integer in [1, {ids.size}], not {prompt_length!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        return sequence_logits(model, ids, None if prompt_length is None else int(prompt_length))  # (T, V)
