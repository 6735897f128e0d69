"""File names for the layers of an slm bundle (`org.opencontainers.image.title`).

ORAS and other OCI clients write each titled layer to a file of that name, so a pulled
composition is a readable directory instead of anonymous `sha256:...` files:

    composition.toml                    the composition record
    base.toml                           the base manifest
    tokenizer.json                      the tokenizer
    base.<tensor name>                  one base tensor, raw bytes (e.g. base.blk.0.attn_q.weight)
    adapter-<name>.toml                 an adapter's manifest (adapter-<i> when it has no name)
    adapter-<name>.<module>.<key>       one adapter tensor (key A, B, ...)
    signature-<i>.json                  a signature

A title is a single path component of [A-Za-z0-9._-] (anything else becomes `_`), never `.`
or `..`, so no client writes outside its output directory. Titles are a function of the
composition alone (stable across pushes); two layers that would share one get the later one
suffixed with its digest. A blob named twice is one layer, titled by its first use.
The titles are annotations only: the composition id and the BLAKE3 names do not depend on them.
"""

from __future__ import annotations

import re

from slm.store import digest as dg

MAX_TITLE = 200
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe(text: str) -> str:
    name = _UNSAFE.sub("_", text)[:MAX_TITLE]
    return "_" + name if name in ("", ".", "..") or name.startswith(".") else name


def unique(entries: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """(digest, media, wanted title) -> the same with titles made safe and distinct."""
    seen: set[str] = set()
    out = []
    for digest, media, title in entries:
        name = safe(title)
        if name in seen:
            name = safe(f"{title}-{dg.short(digest, 12)}")
        seen.add(name)
        out.append((digest, media, name))
    return out


def adapter_prefix(index: int, name: str) -> str:
    return f"adapter-{name}" if name else f"adapter-{index}"
