"""The prompt cache: a prompt's keys/values and last logits, reused when the same prompt comes
again on the same composition. One interface (PromptCache), two backends: MemoryPromptCache
here (`slm serve`'s, in the process) and slm.ops.infer.prefix_cache.DiskPromptCache (`slm run`'s and
the API's, under the store's cache/ folder, within a byte budget for the whole store).

Every entry is keyed by (composition id, prompt tokens): an entry is never used under another
composition, so a switch cannot serve stale keys and values."""

from __future__ import annotations

import collections
from typing import Protocol

import numpy as np

from slm.model.decoder import KVCache

PROMPT_CACHE_ENTRIES = 32
PROMPT_CACHE_BYTES = 128 << 20  # all entries together; a prompt whose keys/values alone are more is not kept


class PromptCache(Protocol):
    """What the generator asks of a prompt cache."""

    def get(self, comp_id: str, tokens: list[int], cache: KVCache) -> np.ndarray | None:
        """Fill `cache` with the prompt's keys/values and return its last logits (V,), or None
        (a miss leaves `cache` as it was)."""

    def put(self, comp_id: str, tokens: list[int], cache: KVCache, logits: np.ndarray) -> None:
        """Keep the prompt's keys/values (cache, filled with exactly `tokens`) and last logits;
        a cache that cannot keep it (over its budget, unwritable) just does not."""


class MemoryPromptCache:
    """Prompt keys/values and last logits in memory: at most `entries` of them and `max_bytes`
    together, the least recently used dropped first."""

    def __init__(self, entries: int = PROMPT_CACHE_ENTRIES, max_bytes: int = PROMPT_CACHE_BYTES):
        self.entries, self.max_bytes, self.bytes = entries, max_bytes, 0
        self._d: collections.OrderedDict = collections.OrderedDict()

    def get(self, comp_id: str, tokens: list[int], cache: KVCache) -> np.ndarray | None:
        hit = self._d.get((comp_id, tuple(tokens)))
        if hit is None or not cache.restore(hit[0], len(tokens)):  # (state, logits, bytes)
            return None
        self._d.move_to_end((comp_id, tuple(tokens)))
        return hit[1]

    def put(self, comp_id: str, tokens: list[int], cache: KVCache, logits: np.ndarray) -> None:
        state = cache.state()
        size = sum(a.nbytes for a in state.values()) + logits.nbytes
        key = (comp_id, tuple(tokens))
        if size > self.max_bytes or key in self._d:
            return
        self._d[key] = (state, logits.copy(), size)
        self.bytes += size
        while len(self._d) > self.entries or self.bytes > self.max_bytes:
            self.bytes -= self._d.popitem(last=False)[1][2]
