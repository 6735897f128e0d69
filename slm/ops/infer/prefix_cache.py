"""The prompt cache on disk (slm.engine.prompt_cache's interface): .slm/cache/prefix/<composition
id>/<mode>-<key>.npz, within a byte budget for the whole store (`[cache] prompt_bytes` in
config.toml).

The key is (composition id, numerics mode, prompt token ids): an entry made under one
composition is never looked up under another, so a switch can never serve stale state, and
one made in the default int8 mode never answers an `--exact` run (whose logits it would not
be). Entries are derived data: a damaged or mismatched one is treated as a miss, and the whole
folder is safe to delete.

A prompt's keys and values grow with the model and the prompt (an 8B-shaped model's long prompt
takes gigabytes), so the cache keeps the newest entries of every composition together within
the budget: an entry larger than the budget is not written at all, and after each write the
oldest entries go until the total fits.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from slm.compose.memory import parse_size
from slm.errors import IOFailure, InvalidInput
from slm.model import modes
from slm.model.decoder import KVCache
from slm.store import digest as dg
from slm.store import fs

DEFAULT_PROMPT_BYTES = 1 << 30  # `[cache] prompt_bytes` when config.toml does not set it


def budget_of(config: dict) -> int:
    """`[cache] prompt_bytes` of a store's config (a size: "512M", "1G", or a number of bytes;
    0 keeps nothing), else DEFAULT_PROMPT_BYTES. InvalidInput (exit 4) for anything else."""
    table = config.get("cache", {})
    value = table.get("prompt_bytes") if isinstance(table, dict) else None
    if value is None:
        return DEFAULT_PROMPT_BYTES
    try:
        size = parse_size(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else -1
    except InvalidInput:
        size = -1
    if size < 0:
        raise InvalidInput(f'config.toml: cache.prompt_bytes must be a size such as "512M" or "1G" '
                           f"(or a number of bytes >= 0), not {value!r}")
    return size


class DiskPromptCache:
    """slm.engine.prompt_cache.PromptCache on disk: every composition's entries under
    cache_root/prefix, `max_bytes` of them together at most."""

    def __init__(self, cache_root: Path, max_bytes: int = DEFAULT_PROMPT_BYTES, mode: str = modes.EXACT):
        self.root = cache_root / "prefix"
        self.max_bytes = max_bytes
        self.mode = mode  # the numerics mode of the entries this cache reads and writes

    def _path(self, comp_id: str, tokens: list[int]) -> Path:
        key = dg.of_bytes(np.asarray(tokens, dtype="<i8").tobytes())
        return self.root / dg.hex_of(comp_id) / f"{self.mode}-{dg.hex_of(key)}.npz"

    def get(self, comp_id: str, tokens: list[int], cache: KVCache) -> np.ndarray | None:
        """Fill `cache` with the prompt's keys/values and return its last logits, or None."""
        path = self._path(comp_id, tokens)
        try:
            with np.load(path, allow_pickle=False) as entry:
                if (str(entry["composition"]) != comp_id or str(entry["mode"]) != self.mode
                        or entry["tokens"].tolist() != list(tokens)):
                    return None
                state = {name: entry[name] for name in entry.files if name[0] in "kv"}
                logits = entry["logits"]
        # missing (OSError), not an .npz or truncated (ValueError, BadZipFile, EOFError), or a
        # field missing (KeyError): derived data that is not there
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
            return None
        return logits if cache.restore(state, len(tokens)) else None

    def put(self, comp_id: str, tokens: list[int], cache: KVCache, logits: np.ndarray) -> None:
        """Store an entry, through the fs layer like every store write; an entry over the
        budget is not written, and a cache that cannot be written (IOFailure: read-only store,
        disk full) is only a missed speed-up."""
        buf = io.BytesIO()
        np.savez(buf, composition=np.str_(comp_id), mode=np.str_(self.mode),
                 tokens=np.asarray(tokens, dtype=np.int64), logits=logits,
                 **cache.state())  # k0, v0, k1, ...: each layer's kept positions
        data = buf.getvalue()
        if len(data) > self.max_bytes:
            return
        path = self._path(comp_id, tokens)
        try:
            for folder in (self.root.parent, self.root, path.parent):  # cache/prefix/<id>
                fs.mkdir(folder)
            fs.atomic_replace(path, data)
            self._trim(keep=path)
        except IOFailure:
            pass

    def _trim(self, keep: Path) -> None:
        """Drop the oldest entries, of any composition, until the total fits the budget (one
        removed meanwhile is skipped; the entry just written is the newest, kept)."""
        entries = []
        for path in self.root.glob("*/*.npz"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            entries.append((stat.st_mtime_ns, stat.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, old in sorted(entries):
            if total <= self.max_bytes:
                break
            if old != keep:
                fs.unlink(old)
                total -= size
