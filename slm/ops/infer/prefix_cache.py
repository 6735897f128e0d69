"""The prompt cache on disk (slm.engine.prompt_cache's interface): .slm/cache/prefix/<composition
id>/<mode>-<key>.npz, within a byte budget for the whole store (`[cache] prompt_bytes` in
config.toml).

The key is (composition id, numerics mode, prompt token ids): an entry made under one
composition is never looked up under another, so a switch can never serve stale state, and
one made in the default int8 mode never answers an `--exact` run (whose logits it would not
be). Entries are derived data: a damaged or mismatched one is treated as a miss, and the whole
folder is safe to delete.

An entry is not trusted for being there: each holds the digest of its own content (every field,
its name, dtype and shape included), taken when it was written, and is used only if its content
still hashes to it. One that does not (damaged, or rewritten by other means than slm: logits
raised towards an answer, say) is a miss and a report: `slm run` says so on stderr (its result's
`prefix_cache` is "damaged"), the run's own entry then replaces it, and `slm fsck` (which
`--repair` removes them) and `slm verify` (a composition's entries) list every such entry.

A prompt's keys and values grow with the model and the prompt (an 8B-shaped model's long prompt
takes gigabytes), so the cache keeps the newest entries of every composition together within
the budget: an entry larger than the budget is not written at all, and after each write the
oldest entries go until the total fits.
"""

from __future__ import annotations

import errno
import io
import os
import stat
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
        self.damaged = 0  # entries found that failed their digest: each a miss, reported

    def _path(self, comp_id: str, tokens: list[int]) -> Path:
        key = dg.of_bytes(np.asarray(tokens, dtype="<i8").tobytes())
        return self.root / dg.hex_of(comp_id) / f"{self.mode}-{dg.hex_of(key)}.npz"

    def get(self, comp_id: str, tokens: list[int], cache: KVCache) -> np.ndarray | None:
        """Fill `cache` with the prompt's keys/values and return its last logits, or None."""
        try:
            fields = read_entry(self._path(comp_id, tokens), self.max_bytes)
        except DamagedEntry:
            self.damaged += 1
            return None
        if (fields is None or str(fields["composition"]) != comp_id or str(fields["mode"]) != self.mode
                or fields["tokens"].tolist() != list(tokens)):
            return None
        state = {name: fields[name] for name in fields if name[0] in "kv"}
        return fields["logits"] if cache.restore(state, len(tokens)) else None

    def put(self, comp_id: str, tokens: list[int], cache: KVCache, logits: np.ndarray) -> None:
        """Store an entry, through the fs layer like every store write; an entry over the
        budget is not written, and a cache that cannot be written (IOFailure: read-only store,
        disk full) is only a missed speed-up."""
        fields = {"composition": np.str_(comp_id), "mode": np.str_(self.mode),
                  "tokens": np.asarray(tokens, dtype=np.int64), "logits": logits,
                  **cache.state()}  # k0, v0, k1, ...: each layer's kept positions
        buf = io.BytesIO()
        np.savez(buf, digest=np.str_(content_digest(fields)), **fields)
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


class DamagedEntry(Exception):
    """An entry whose content does not hash to the digest it was written with, or that cannot
    be read as an entry at all."""


def content_digest(fields: dict[str, np.ndarray]) -> str:
    """The digest of an entry's fields: each one's name, dtype, shape and bytes, in name order."""
    h = dg.hasher()
    for name in sorted(fields):
        value = np.ascontiguousarray(fields[name])
        h.update(f"{name}\0{value.dtype.str}\0{value.shape}\0".encode())
        h.update(value.reshape(-1).view(np.uint8))  # (its bytes, not a copy of them)
    return "blake3:" + h.hexdigest()


def read_entry(path: Path, limit: float) -> dict[str, np.ndarray] | None:
    """An entry's fields (its digest checked), None if there is none (or it is over `limit`
    bytes); DamagedEntry if it is not a regular file holding uncompressed fields that hash to its
    digest. A link planted in the cache is not followed and a FIFO does not block."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise DamagedEntry("a symlink") from err
        return None  # unreadable: a miss, as a cache that cannot be read is
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DamagedEntry("not a regular file")
        if info.st_size > limit:
            return None  # written under a larger budget: not worth reading now
        try:
            with zipfile.ZipFile(f) as archive:  # stored fields only: what is read is what the file holds
                if any(m.compress_type != zipfile.ZIP_STORED for m in archive.infolist()):
                    raise DamagedEntry("compressed fields")
            f.seek(0)
            with np.load(f, allow_pickle=False) as entry:
                fields = {name: entry[name] for name in entry.files}
        # not an .npz or truncated (ValueError, BadZipFile, EOFError), a field missing (KeyError)
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise DamagedEntry(f"not a readable entry ({type(err).__name__})") from err
    digest = fields.pop("digest", None)
    if digest is None or str(digest) != content_digest(fields):
        raise DamagedEntry("its content does not hash to the digest it was written with")
    return fields


def damaged_entries(cache_root: Path, comp_id: str | None = None) -> tuple[int, list[tuple[Path, str]]]:
    """How many entries there are (of one composition, or all) and each that is damaged, with why."""
    root = cache_root / "prefix"
    paths = sorted(root.glob(f"{dg.hex_of(comp_id)}/*.npz" if comp_id else "*/*.npz"))
    damaged = []
    for path in paths:
        try:
            read_entry(path, float("inf"))
        except DamagedEntry as err:
            damaged.append((path, str(err)))
    return len(paths), damaged
