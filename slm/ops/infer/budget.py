"""The memory budget: `--memory-budget`, else `memory_budget` in the store's config.toml."""

from __future__ import annotations

from slm.compose.memory import DEFAULT_POSITIONS, Estimate, estimate, parse_size
from slm.engine.budget import check_budget as check  # noqa: F401  (the one check)
from slm.model import modes
from slm.model.kernel_choice import fused_selected
from slm.ops.infer.compositions import Staged
from slm.store import StoreDir


def resolve(store: StoreDir, flag: str | None) -> int | None:
    if flag is not None:
        return parse_size(flag)
    configured = store.config.get("defaults", {}).get("memory_budget")
    return None if configured in (None, "", 0) else parse_size(configured)


def of_staged(staged: Staged, positions: int = DEFAULT_POSITIONS, prompt_tokens: int | None = None,
              all_logits: bool = False, sequences: int = 1, mode: str | None = None) -> Estimate:
    """mode: the numerics mode it runs in (slm.model.modes); None: the default mode."""
    adapter_bytes = sum(m.total_bytes for _, m in staged.adapters)
    mode = modes.resolve(False) if mode is None else mode
    return estimate(staged.base.architecture, staged.base.total_bytes, adapter_bytes, positions,
                    prompt_tokens, all_logits, fused_kernels=fused_selected(), sequences=sequences,
                    int8_factors=mode == modes.INT8)
