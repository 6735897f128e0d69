"""Every typed result of the operations: what the public API returns and the CLI prints.

Each derives from `Result`, which owns `to_json()` (plain dicts and lists: what `--json`
prints); each is a frozen dataclass, so a result cannot be changed after the fact by whoever
holds it; each is exported from `slm` (docs/api.md, "Results and errors"). Built in one place
each: the operation that produced the facts. The package imports only the standard library (and
slm.engine.request's plain ToolCall), so any layer from slm/ops up may build these without a cycle.

One module per verb family, each loaded when one of its names is first asked for
(`from slm.ops.results import Transition`, PEP 562): creating a frozen dataclass compiles each
of its generated methods, and `slm activate`, a process of its own each time, needs only the
switches' results: it pays start-up for those alone.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict
from typing import TYPE_CHECKING, Any


class Result:
    """The base of every result: `to_json()` is the dataclass's fields as plain data."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


_FAMILIES = {
    "switches": ("AdapterEntry", "CompositionInfo", "Transition", "Status", "LogEntry", "NameMove"),
    "generation": ("Timings", "Alternative", "TokenLogprobs", "Generation"),
    "integrity": ("Finding", "FsckReport", "GcPlan", "VerifyReport"),
    "transfer": ("ImportResult", "ExportResult", "AdapterExportResult", "BaseExportResult", "ReceiveResult",
                 "PushResult", "Provisioned"),
    "signatures": ("SignatureCheck", "SignResult", "StatementResult", "OmsSignResult", "SignatureReport", "Certified"),
    "health": ("HealthCheck", "HealthReport"),
    "follow": ("FollowRound", "FollowStatus"),
}
_MODULE_OF = {name: family for family, names in _FAMILIES.items() for name in names}
__all__ = ["Result", *_MODULE_OF]


def __getattr__(name: str):
    family = _MODULE_OF.get(name)
    if family is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{family}"), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # for type checkers and IDEs; at run time each family loads on first use
    from slm.ops.results.follow import *  # noqa: F401,F403
    from slm.ops.results.generation import *  # noqa: F401,F403
    from slm.ops.results.health import *  # noqa: F401,F403
    from slm.ops.results.integrity import *  # noqa: F401,F403
    from slm.ops.results.signatures import *  # noqa: F401,F403
    from slm.ops.results.switches import *  # noqa: F401,F403
    from slm.ops.results.transfer import *  # noqa: F401,F403
