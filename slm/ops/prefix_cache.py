"""Prompt KV cache under .slm/cache/prefix/<composition id>/<key>.npz.

The key is (composition id, prompt token ids): an entry made under one composition is never
looked up under another, so a switch can never serve stale state. Entries are derived data:
a damaged or mismatched one is treated as a miss, and the whole folder is safe to delete.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from slm.errors import IOFailure
from slm.model.decoder import KVCache
from slm.store import digest as dg
from slm.store import fs

MAX_ENTRIES = 64  # per composition; the oldest are dropped first


class PrefixCache:
    def __init__(self, cache_root: Path, comp_id: str):
        self.dir = cache_root / "prefix" / dg.hex_of(comp_id)
        self.comp_id = comp_id

    def _path(self, tokens: list[int]) -> Path:
        key = dg.of_bytes(np.asarray(tokens, dtype="<i8").tobytes())
        return self.dir / f"{dg.hex_of(key)}.npz"

    def get(self, tokens: list[int], cache: KVCache) -> np.ndarray | None:
        """Fill `cache` with the prompt's keys/values and return its last logits, or None."""
        path = self._path(tokens)
        try:
            with np.load(path, allow_pickle=False) as entry:
                if str(entry["composition"]) != self.comp_id or entry["tokens"].tolist() != list(tokens):
                    return None
                state = {name: entry[name] for name in entry.files if name[0] in "kv"}
                logits = entry["logits"]
        # missing (OSError), not an .npz or truncated (ValueError, BadZipFile, EOFError), or a
        # field missing (KeyError): derived data that is not there
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
            return None
        return logits if cache.restore(state, len(tokens)) else None

    def put(self, tokens: list[int], cache: KVCache, logits: np.ndarray) -> None:
        """Store an entry, through the fs layer like every store write; a cache that cannot be
        written (IOFailure: read-only store, disk full) is only a missed speed-up."""
        buf = io.BytesIO()
        np.savez(buf, composition=np.str_(self.comp_id), tokens=np.asarray(tokens, dtype=np.int64),
                 logits=logits, **cache.state())  # k0, v0, k1, ...: each layer's kept positions
        try:
            for folder in (self.dir.parent.parent, self.dir.parent, self.dir):  # cache/prefix/<id>
                fs.mkdir(folder)
            fs.atomic_replace(self._path(tokens), buf.getvalue())
            self._trim()
        except IOFailure:
            pass

    def _trim(self) -> None:
        """Drop the oldest entries beyond MAX_ENTRIES (one removed meanwhile is skipped)."""
        entries = []
        for path in self.dir.glob("*.npz"):
            try:
                entries.append((path.stat().st_mtime, path))
            except FileNotFoundError:
                continue
        for _, old in sorted(entries)[:-MAX_ENTRIES]:
            fs.unlink(old)
