"""`slm run` and `slm serve`: generation on a composition, from the shell or over HTTP.

No `from __future__ import annotations` in slm/cli (typer reads the annotations)."""

import sys
from pathlib import Path
from typing import List, Optional

import typer

from slm import render
from slm.cli.common import (
    ExactOpt, InsecureOpt, JsonOpt, MemoryBudgetOpt, app, decimal, integer, open_store, progress_bar, show_result,
)


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    prompt: str = typer.Argument(..., help="The prompt; '-' reads it from standard input."),
    base: Optional[str] = typer.Option(
        None, "--base", "-b", help="Run this base alone instead of the active composition."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="SPEC",
        help="Run this composition without activating it: @active, an id or prefix, or "
             "BASE+ADAPTER@W+... (checked as `slm activate` checks it; refs/active is not touched)."),
    system: Optional[str] = typer.Option(
        None, "--system", metavar="TEXT", help="A system message before the prompt (implies --chat)."),
    stop: Optional[List[str]] = typer.Option(
        None, "--stop", metavar="TEXT",
        help="Stop before this text (repeatable, up to 4); the text ends before it."),
    max_tokens: Optional[int] = typer.Option(
        None, "--max-tokens", "-n", parser=integer,
        help="Stop after this many new tokens (default: 128, or what the context leaves; more than the context "
             "leaves is refused)."),
    temperature: float = typer.Option(
        0.0, "--temperature", "-t", parser=decimal,
        help="0 is greedy (deterministic); any finite value >= 0 (one so small that only the top "
             "logit keeps weight samples it, as greedy does)."),
    top_p: float = typer.Option(1.0, "--top-p", parser=decimal, help="Nucleus sampling mass (with --temperature > 0)."),
    seed: Optional[int] = typer.Option(
        None, "--seed", parser=integer,
        help="Seed for sampling; the same seed gives the same text. Default: a fresh random seed, "
             "reported (--json: \"seed\")."),
    top_k: int = typer.Option(0, "--top-k", parser=integer, help="Sample among the K most likely tokens (0: all)."),
    min_p: float = typer.Option(
        0.0, "--min-p", parser=decimal, help="Drop tokens under this fraction of the top token's probability."),
    repeat_penalty: float = typer.Option(
        1.0, "--repeat-penalty", parser=decimal,
        help="llama.cpp's: divide positive, multiply negative logits of tokens already generated (1: off)."),
    repetition_penalty: float = typer.Option(
        1.0, "--repetition-penalty", parser=decimal,
        help="vLLM's: --repeat-penalty's rule over the prompt's tokens too (1: off; not with --repeat-penalty)."),
    min_tokens: int = typer.Option(
        0, "--min-tokens", parser=integer,
        help="vLLM's: no stop (end of generation, --stop, --stop-token-id) before this many tokens."),
    ignore_eos: bool = typer.Option(
        False, "--ignore-eos", help="vLLM's: an end-of-generation token does not end the answer (until --max-tokens)."),
    stop_token_id: Optional[List[int]] = typer.Option(
        None, "--stop-token-id", metavar="ID", parser=integer,
        help="vLLM's stop_token_ids: generating this token ends the answer (repeatable)."),
    include_stop: bool = typer.Option(
        False, "--include-stop",
        help="vLLM's include_stop_str_in_output: the stop sequence or token stays in the text."),
    special_tokens: bool = typer.Option(
        False, "--special-tokens", help="vLLM's skip_special_tokens false: special tokens' texts are in the answer."),
    frequency_penalty: float = typer.Option(
        0.0, "--frequency-penalty", parser=decimal, help="OpenAI's, -2..2: minus this times a token's count so far."),
    presence_penalty: float = typer.Option(
        0.0, "--presence-penalty", parser=decimal, help="OpenAI's, -2..2: minus this for a token generated before."),
    logprobs: Optional[int] = typer.Option(
        None, "--logprobs", metavar="K", parser=integer,
        help="With --json: each token's logprob and its K most likely alternatives (0..20)."),
    chat: bool = typer.Option(
        False, "--chat",
        help="Wrap the prompt in the base's chat template (the prompt is text: a control token "
             "spelled in it stays text)."),
    logits_out: Optional[Path] = typer.Option(
        None, "--logits-out", metavar="FILE.npy",
        help="Save float32 logits (positions x vocab) for every prompt and generated position.",
    ),
    json_schema: Optional[Path] = typer.Option(
        None, "--json-schema", metavar="FILE",
        help="The answer is JSON valid under this JSON schema (grammar-constrained decoding)."),
    tools: Optional[Path] = typer.Option(
        None, "--tools", metavar="FILE",
        help="Functions the model may call: OpenAI's tools list, as JSON (implies --chat; the calls: --json's "
             "\"tool_calls\")."),
    tool_choice: Optional[str] = typer.Option(
        None, "--tool-choice", metavar="CHOICE",
        help="With --tools: auto (the answer may call; the default), required (it must), none (it must not), "
             "or the name of the function it must call."),
    memory_budget: Optional[str] = MemoryBudgetOpt,
    on_switch: str = typer.Option(
        "stop", "--on-switch", metavar="stop|finish",
        help="If the active composition changes mid-generation: stop at the next token "
             "(exit code 11) or finish on the composition generation started with."),
    threads: Optional[int] = typer.Option(
        None, "--threads", metavar="N",
        parser=integer, help="Threads for the kernels (default: every core; 1 is faster when another program "
             "keeps a core busy). The text does not depend on it."),
    exact: bool = ExactOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Generate text on the active composition (or --model SPEC, --base), streaming it."""
    import slm
    from slm.api import GenerationRequest
    from slm.ops.infer.run import RunOptions, prompt_from_stdin

    slm.keep_freed_memory()  # a setting of this process, as OPENBLAS_NUM_THREADS (slm/entry.py)

    if prompt == "-":  # read during start-up: Ctrl-C while it waits exits at once (slm/entry.py)
        prompt = prompt_from_stdin(sys.stdin)
    store = open_store(ctx)
    request = GenerationRequest(prompt=prompt, chat=chat, system=system, stop=tuple(stop or ()), max_tokens=max_tokens,
                                temperature=temperature, top_p=top_p, seed=seed, top_k=top_k, min_p=min_p,
                                repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, logprobs=logprobs,
                                repetition_penalty=repetition_penalty, min_tokens=min_tokens, ignore_eos=ignore_eos,
                                stop_token_ids=tuple(stop_token_id or ()), include_stop_str_in_output=include_stop,
                                skip_special_tokens=not special_tokens)
    options = RunOptions(request, base=base, model=model, logits_out=logits_out, memory_budget=memory_budget,
                         on_switch=on_switch, threads=threads, exact=exact, json_schema=json_schema, tools=tools,
                         tool_choice=tool_choice)
    result = store.run(options, on_text=None if json_out else render.stream_text)
    if result.prefix_cache == "damaged":
        render.damaged_cache_entry()
    show_result(result, json_out, render.run_footer)


@app.command()
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback unless told otherwise)."),
    port: int = typer.Option(8080, "--port", parser=integer, help="TCP port (0: any free port, printed at start)."),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="SLM_API_KEY", metavar="KEY", show_envvar=True,
        help="Require Authorization: Bearer KEY on every endpoint but /health and /get_load."),
    max_batch: int = typer.Option(8, "--max-batch", metavar="N", parser=integer, help="Requests decoded together in one step."),
    max_queue: Optional[int] = typer.Option(
        None, "--max-queue", metavar="N", parser=integer, help="Requests waiting beyond the batch before HTTP 429 (default 4 x N)."),
    memory_budget: Optional[str] = MemoryBudgetOpt,
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N", parser=integer, help="Threads for the kernels (default: every core)."),
    exact: bool = ExactOpt,
    body_limit: int = typer.Option(1 << 20, "--body-limit", metavar="BYTES", parser=integer, help="Largest request body accepted."),
    grace: float = typer.Option(10.0, "--grace", metavar="SECONDS",
                                parser=decimal, help="On SIGTERM/SIGINT, how long running requests get to finish."),
    prefill_chunk: int = typer.Option(
        512, "--prefill-chunk", metavar="TOKENS", parser=integer,  # slm.engine.generate.PREFILL_CHUNK (not imported: start-up)
        help="Prompt tokens prefilled between two decode steps of the running requests."),
    model: Optional[str] = typer.Option(
        None, "--model", metavar="REF",
        help="Before serving, pull HOST[:PORT]/REPO[:TAG|@sha256:..] and activate it (`slm pull` + "
             "`slm activate`): a digest already pulled is not downloaded again; a tag is resolved again "
             "at each start."),
    follow: Optional[str] = typer.Option(
        None, "--follow", metavar="REF",
        help="Follow the registry tag HOST[:PORT]/REPO:TAG while serving, as `slm follow REF` does (docs/fleet.md): "
             "each version it activates is served at once (hot swap). Not with --model."),
    follow_interval: Optional[str] = typer.Option(
        None, "--follow-interval", metavar="DURATION",
        help="With --follow: time between rounds (30s, 5m, 1h); default: config.toml's [follow] interval, else 5m."),
    insecure: bool = InsecureOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Serve the store's compositions over an OpenAI-compatible HTTP API (docs/serve.md).

    Follows `slm activate` from other processes (hot swap); never writes to the store, but for
    --model, which pulls and activates before the server starts, and --follow, whose follower
    pulls, activates and rolls back while it serves.
    Logs one line per request on stderr; with --json, one JSON object per line on stdout."""
    import slm
    from slm import render_dist
    from slm.server.app import json_log, stderr_log
    from slm.server.serve import ServeOptions, check
    from slm.server.serve import serve as run_server

    slm.keep_freed_memory()  # a setting of this process, as OPENBLAS_NUM_THREADS (slm/entry.py)

    options = ServeOptions(host=host, port=port, api_key=api_key, max_batch=max_batch, max_queue=max_queue,
                           memory_budget=memory_budget, threads=threads, exact=exact,
                           body_limit=body_limit, grace=grace, prefill_chunk=prefill_chunk, follow=follow,
                           follow_interval=follow_interval, insecure=insecure)
    log = json_log if json_out else stderr_log
    store = open_store(ctx)
    check(options, model)  # a bad option fails before anything is downloaded (the budget: in provision)
    if model is not None:
        ready = store.provision(model, insecure, memory_budget, progress_bar(json_out))
        log(render_dist.provisioned(ready))
    run_server(store, options, log=log)


@app.command("chat")
def chat_cmd(
    ctx: typer.Context,
    spec: Optional[str] = typer.Argument(
        None, metavar="[SPEC]",
        help="The composition to talk to (default: the active one): @active, an id or prefix, or "
             "BASE+ADAPTER@W+... (not activated)."),
    system: Optional[str] = typer.Option(None, "--system", metavar="TEXT", help="The system message."),
    max_tokens: int = typer.Option(
        512, "--max-tokens", "-n", parser=integer,
        help="Longest answer, in tokens (a turn whose conversation leaves the context less is refused, as "
             "`slm run` refuses it)."),
    temperature: float = typer.Option(
        0.0, "--temperature", "-t", parser=decimal, help="0 is greedy (deterministic); any finite value >= 0."),
    top_p: float = typer.Option(1.0, "--top-p", parser=decimal, help="Nucleus sampling mass (with --temperature > 0)."),
    seed: Optional[int] = typer.Option(None, "--seed", parser=integer, help="Seed for sampling (default: fresh per answer)."),
    top_k: int = typer.Option(0, "--top-k", parser=integer, help="Sample among the K most likely tokens (0: all)."),
    min_p: float = typer.Option(
        0.0, "--min-p", parser=decimal, help="Drop tokens under this fraction of the top token's probability."),
    stop: Optional[List[str]] = typer.Option(
        None, "--stop", metavar="TEXT", help="End an answer before this text (repeatable, up to 4)."),
    threads: Optional[int] = typer.Option(
        None, "--threads", metavar="N", parser=integer, help="Threads for the kernels (default: every core)."),
    exact: bool = ExactOpt,
) -> None:
    """Chat with a composition in the base's chat template, turn after turn.

    The conversation stays in memory. /reset forgets it, /model SPEC switches composition,
    /exit (or Ctrl-D) leaves. Ctrl-C stops the answer being written, not the chat; Ctrl-C twice
    at the prompt leaves."""
    import slm

    slm.keep_freed_memory()  # a setting of this process, as OPENBLAS_NUM_THREADS (slm/entry.py)
    runtime = slm.Runtime(open_store(ctx), threads=threads, exact=exact)
    conversation = slm.Conversation(runtime, spec, system=system, max_tokens=max_tokens, temperature=temperature,
                                    top_p=top_p, seed=seed, top_k=top_k, min_p=min_p, stop=tuple(stop or ()))
    view = render.ChatPrinter()
    conversation.loop(view.read_line, view)
