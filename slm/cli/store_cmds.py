"""`slm` commands on the store: init, import, activate, deactivate, rollback, status, log,
fsck, gc, verify, health, ls, show.

No `from __future__ import annotations` in slm/cli (typer reads the annotations)."""

from pathlib import Path
from typing import Optional

import typer

from slm import render
from slm.cli.common import (
    JsonOpt, MemoryBudgetOpt, app, decimal, hand_ctrl_c_to_the_command, import_app, integer, open_store,
    progress_bar, show_result,
)


@app.command()
def init(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """Create an empty store (./.slm, or --store / $SLM_STORE)."""
    from slm.api import Store

    hand_ctrl_c_to_the_command()
    store = Store.init(ctx.obj["store"])
    show_result({"store": str(store.root), "created": store.created}, json_out, render.init_done)


@import_app.command("base")
def import_base(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="A .gguf file or a Hugging Face checkpoint directory."),
    name: str = typer.Option(..., "--name", "-n", help="Name for the base in the store."),
    quant: Optional[str] = typer.Option(
        None, "--quant", "-q",
        help="Hugging Face checkpoints only: q8_0 (default), q4_0, q4_1, q5_0, q5_1, q4_k, q6_k, "
             "q4_k_m (llama.cpp's Q4_K_M mix), nf4, f16 or f32.",
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Import a base model. GGUF tensors are kept byte for byte; HF weights are quantized."""
    show_result(open_store(ctx).import_base(path, name, quant, progress_bar(json_out)), json_out, render.import_summary)


@import_app.command("adapter")
def import_adapter(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="A PEFT adapter directory or a GGUF LoRA file."),
    name: str = typer.Option(..., "--name", "-n", help="Name for the adapter in the store."),
    base: Optional[str] = typer.Option(
        None, "--base", "-b", metavar="BASE",
        help="The stored base the adapter is for: its shapes are taken from it (not inferred "
             "from the adapter) and the adapter must fit it."),
    json_out: bool = JsonOpt,
) -> None:
    """Import a LoRA, IA3 or SHiRA adapter (PEFT), or a GGUF LoRA (llama.cpp)."""
    show_result(open_store(ctx).import_adapter(path, name, progress_bar(json_out), base), json_out, render.import_summary)


@import_app.command("bundle")
def import_bundle(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="An OCI image layout directory or .tar (slm export, skopeo copy oci:...)."),
    tag: Optional[str] = typer.Option(None, "--tag", help="Which manifest of the layout's index (its ref name)."),
    json_out: bool = JsonOpt,
) -> None:
    """Import a composition bundle: every blob re-hashed (sha256 and BLAKE3), one transaction."""
    from slm import render_dist

    show_result(open_store(ctx).import_bundle(path, tag, progress_bar(json_out)), json_out, render_dist.received)


@app.command()
def activate(
    ctx: typer.Context,
    base: Optional[str] = typer.Argument(
        None, metavar="[BASE|SPEC]",
        help="The base (name or digest) followed by adapters, or alone any composition spec: a tag, "
             "BASE+ADAPTER[@WEIGHT]..., an id or 6+ hex prefix, @active~N, a pulled HOST/repo:tag."),
    adapters: Optional[list[str]] = typer.Argument(
        None, metavar="[ADAPTER[@WEIGHT]]...",
        help="Adapters in load order, each with an optional weight: a decimal number in ASCII digits "
             "(0.8, -0.5, .5, 1e-3; default 1)."),
    file: Optional[Path] = typer.Option(None, "-f", "--file", help="Activate a composition manifest (TOML)."),
    upgrade: bool = typer.Option(
        False, "--upgrade",
        help="Rebuild the active composition (or the one named instead of BASE) for this slm "
             "version, verify it against the oracle, and activate it."),
    memory_budget: Optional[str] = MemoryBudgetOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Validate a composition and make it the active one, atomically."""
    result = open_store(ctx).activate(base, adapters or [], file=file, memory_budget=memory_budget,
                                  upgrade=upgrade)
    show_result(result, json_out, render.transition)


@app.command()
def deactivate(
    ctx: typer.Context,
    adapter: str = typer.Argument(..., help="The adapter to remove from the active composition."),
    json_out: bool = JsonOpt,
) -> None:
    """Remove one adapter from the active composition."""
    show_result(open_store(ctx).deactivate(adapter), json_out, render.transition)


@app.command()
def rollback(
    ctx: typer.Context,
    steps: Optional[int] = typer.Option(None, "-n", parser=integer, help="Go back N transitions (default 1)."),
    to: Optional[str] = typer.Option(None, "--to", metavar="SPEC",
                                     help="Go back to this composition (an id, a tag, @active~N...)."),
    json_out: bool = JsonOpt,
) -> None:
    """Make an earlier composition active again (itself a logged transition)."""
    show_result(open_store(ctx).rollback(steps, to), json_out, render.transition)


@app.command()
def status(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """Show the active composition."""
    show_result(open_store(ctx).status(), json_out, render.status)


@app.command("log")
def log_cmd(
    ctx: typer.Context,
    name: Optional[str] = typer.Argument(
        None, metavar="[NAME]", help="A base, adapter, tag or pulled reference: its history instead."),
    json_out: bool = JsonOpt,
) -> None:
    """Show the reflog: every transition of the active composition (or every move of NAME),
    newest first."""
    store = open_store(ctx)
    entries = store.log() if name is None else store.name_log(name)
    show_result([e.to_json() for e in entries], json_out, render.reflog)


@app.command()
def fsck(
    ctx: typer.Context,
    repair: bool = typer.Option(False, "--repair", help="Restore the last consistent state; say what was done."),
    json_out: bool = JsonOpt,
) -> None:
    """Check every blob, manifest, name, ref and reflog line (re-hashing everything)."""
    show_result(open_store(ctx, check_config=False).fsck(repair, progress_bar(json_out)), json_out, render.fsck_report)


@app.command()
def gc(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; remove nothing."),
    prune_now: bool = typer.Option(
        False, "--prune-now",
        help="Keep only what names point at now (and the active reflog): old targets in names' "
             "reflogs go at once, not after gc.reflog_expiry (config.toml, default 90d)."),
    json_out: bool = JsonOpt,
) -> None:
    """Remove blobs and records that no name, ref or reflog line can reach."""
    result = open_store(ctx).gc(dry_run, on_plan=None if json_out else render.gc_plan, prune_now=prune_now)
    show_result(result, json_out, render.gc_done)


@app.command()
def verify(
    ctx: typer.Context,
    ref: Optional[str] = typer.Argument(
        None, metavar="[SPEC]",
        help="A composition spec (a tag, an id or prefix, BASE+ADAPTER@W..., a base); default: the active one."),
    numerics: bool = typer.Option(True, "--numerics/--no-numerics",
                                  help="Also compare logits with the fresh-base oracle."),
    signature: bool = typer.Option(
        False, "--signature", help="Check the composition's signatures instead (trusted: config.toml "
                                   "trusted_keys and each --key)."),
    key: Optional[list[str]] = typer.Option(
        None, "--key", metavar="KEY",
        help="With --signature: a trusted public key (ed25519:BASE64 or a PEM file; repeatable). "
             "With --certificate: the Ed25519 PEM private key that signs it."),
    certificate: Optional[Path] = typer.Option(
        None, "--certificate", metavar="FILE",
        help="Write the result as a certificate signed with --key, bound to the composition id; one that "
             "certifies passing numerics of a stored composition is also recorded with it (it travels with "
             "export, push and pull; slm health checks it)."),
    json_out: bool = JsonOpt,
) -> None:
    """Re-hash every blob of a composition and check its logits against the fresh-base oracle
    (--certificate: and write the result signed); --signature: check its signatures instead."""
    from slm import render_dist

    result = open_store(ctx).verify_as_asked(ref, numerics, signature, key or [], certificate, progress_bar(json_out))
    show_result(result, json_out, render_dist.verify_result)


@app.command()
def health(
    ctx: typer.Context,
    ref: Optional[str] = typer.Argument(
        None, metavar="[SPEC]", help="A composition spec; default: the active one."),
    certificate: Optional[Path] = typer.Option(
        None, "--certificate", metavar="FILE",
        help="A signed verify certificate of the composition to check instead of those recorded with it: "
             "its numerics and golden answers are checked again here (none given or recorded: skipped)."),
    timeout: float = typer.Option(60.0, "--timeout", metavar="S", parser=decimal, help="Each health.d script's deadline, in seconds."),
    json_out: bool = JsonOpt,
) -> None:
    """Run the health checks of a composition (integrity, its certificate, a short generation,
    the store's health.d/ scripts), stopping at the first failure: exit 18 (docs/health.md)."""
    from slm import render_dist

    result = open_store(ctx).health(ref, certificate=certificate, timeout_s=timeout)
    show_result(result, json_out, render_dist.health_report)


@app.command("ls")
def ls(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """List the bases, adapters and compositions in the store."""
    show_result(open_store(ctx).ls(), json_out, render.entries_table)


@app.command()
def show(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="NAME|DIGEST|SPEC",
                              help="A name, a digest or prefix, or any composition spec."),
    json_out: bool = JsonOpt,
) -> None:
    """Print a base, adapter or composition manifest."""
    show_result(open_store(ctx).show(ref), json_out, render.manifest)
