"""The memory budget's one check, for a request (slm.engine.prepare) and for staging a
composition (slm.ops.infer.budget): light to import, for `slm activate`'s start-up."""

from __future__ import annotations

from slm.errors import BudgetExceeded


def check_budget(estimate, budget: int | None, what: str) -> None:
    """BudgetExceeded if the estimate (a slm.engine.target.MemoryEstimate) is over the budget
    (bytes; None: no budget)."""
    if budget is not None and estimate.total > budget:
        raise BudgetExceeded(f"{what} needs an estimated {estimate.describe()}, over the memory budget of "
                             f"{budget / 2**20:.0f} MiB")
