"""`slm` commands that ship a composition: export, push, pull, sign.

No `from __future__ import annotations` in slm/cli (typer reads the annotations)."""

from pathlib import Path
from typing import Optional

import typer

from slm.cli.common import InsecureOpt, JsonOpt, app, open_store, progress_bar, show_result


@app.command("export")
def export_cmd(
    ctx: typer.Context,
    ref: Optional[str] = typer.Argument(
        None, metavar="[COMPOSITION|BASE|ADAPTER]", help="What to export (default: the active composition)."),
    out: Path = typer.Option(..., "-o", "--output", metavar="DIR|FILE.tar|FILE.gguf",
                             help="Where to write it (must not exist)."),
    fmt: str = typer.Option(
        "slm", "--format", metavar="slm|gguf|gguf-lora|peft",
        help="slm: an OCI image layout bundle (a .tar name writes a tar); gguf: a BASE as the GGUF file it was "
             "imported from, byte for byte; gguf-lora: one LoRA adapter for "
             "llama.cpp; peft: one LoRA adapter as a PEFT directory."),
    base: Optional[str] = typer.Option(None, "--base", help="gguf-lora / peft of an ADAPTER: the base it is for."),
    tag: Optional[str] = typer.Option(None, "--tag", help="slm: the ref name in index.json (default: short id)."),
    json_out: bool = JsonOpt,
) -> None:
    """Export a composition as a bundle, a base as its GGUF file, or a LoRA adapter for llama.cpp or PEFT."""
    from slm import render_dist

    show_result(open_store(ctx).export(ref, out, fmt, base, tag, progress_bar(json_out)), json_out, render_dist.exported)


@app.command()
def push(
    ctx: typer.Context,
    reference: str = typer.Argument(..., metavar="HOST[:PORT]/REPO[:TAG]", help="Where to push (tag default: short id)."),
    ref: Optional[str] = typer.Argument(None, metavar="[COMPOSITION]", help="Default: the active composition."),
    as_format: str = typer.Option(
        "slm", "--as", metavar="slm|modelpack|docker",
        help="slm: slm's own bundle; modelpack / docker: a model artifact of GGUF files (the base's original "
             "GGUF, each LoRA as a GGUF LoRA) that ModelPack tools and Docker Model Runner read."),
    insecure: bool = InsecureOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Upload a composition to an OCI registry (only the blobs it lacks)."""
    from slm import render_dist

    show_result(open_store(ctx).push(reference, ref, insecure, progress_bar(json_out), as_format), json_out,
                render_dist.pushed)


@app.command()
def pull(
    ctx: typer.Context,
    reference: str = typer.Argument(..., metavar="HOST[:PORT]/REPO[:TAG|@sha256:..]", help="What to pull."),
    insecure: bool = InsecureOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Receive a composition from an OCI registry (only the blobs the store lacks; all verified), or a
    ModelPack / Docker model artifact of GGUF files (imported as a base and its LoRA adapters).

    A store that requires signatures receives only a composition a trusted key signed: anything
    else is refused before a byte is written."""
    from slm import render_dist

    show_result(open_store(ctx).pull(reference, insecure, progress_bar(json_out)), json_out, render_dist.received)


@app.command()
def sign(
    ctx: typer.Context,
    ref: Optional[str] = typer.Argument(
        None, metavar="[COMPOSITION|DIR]", help="Default: the active composition. --format oms: the directory."),
    key: Optional[Path] = typer.Option(
        None, "--key", metavar="KEY.pem",
        help="slm: an Ed25519 private key (openssl genpkey -algorithm ed25519); oms --out: an ECDSA P-256/P-384 "
             "private key (openssl ecparam -name prime256v1 -genkey -noout); oms --signature: the signer's public key."),
    fmt: str = typer.Option(
        "slm", "--format", metavar="slm|oms",
        help="slm: sign a stored composition's id; oms: an OpenSSF Model Signing v1 signature of DIR."),
    out: Optional[Path] = typer.Option(None, "--out", metavar="SIG", help="oms: write the signature of DIR here."),
    signature: Optional[Path] = typer.Option(
        None, "--signature", metavar="SIG",
        help="oms: record this signature of DIR (an exported bundle) with the composition DIR holds."),
    certificate: Optional[Path] = typer.Option(
        None, "--certificate", metavar="CERT.pem", help="oms --out: sign in certificate mode (the --key's certificate)."),
    chain: Optional[list[str]] = typer.Option(
        None, "--certificate-chain", metavar="PEM",
        help="oms --out: the certificates above --certificate; oms --signature: the trusted root(s). Repeatable."),
    for_tag: Optional[str] = typer.Option(
        None, "--for", metavar="REPO:TAG",
        help="Sign a statement for this tag (with --version and --expires) that a device following it checks "
             "(oms: in the predicate of --out)."),
    version: Optional[int] = typer.Option(
        None, "--version", metavar="N", help="--for: the statement's version, above every earlier one for the tag."),
    expires: Optional[str] = typer.Option(
        None, "--expires", metavar="DURATION", help="--for: how long the statement holds: 30d, 12h, 90m (at most 366d)."),
    json_out: bool = JsonOpt,
) -> None:
    """Sign a composition id with Ed25519 (stored with it), or a directory as OpenSSF Model Signing;
    with --for, a statement that the composition is version N of REPO:TAG until an expiry."""
    from slm import render_dist

    show_result(open_store(ctx).sign(ref, key, fmt, out, signature, certificate, chain or [], for_tag, version, expires),
                json_out, render_dist.signed)
