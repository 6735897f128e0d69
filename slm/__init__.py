"""slm: an immutable quantized base, adapters as reversible overlays.

The public API (docs/api.md). Importing slm is cheap and changes nothing in the process: the
names below load their modules on first use (PEP 562), so the `slm` command's start-up does
not pay for NumPy or the executor, and no environment variable is set here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_RESULTS = ("AdapterEntry", "AdapterExportResult", "Alternative", "BaseExportResult", "Certified", "CompositionInfo",
            "ExportResult", "Finding", "FollowRound", "FollowStatus", "FsckReport", "GcPlan", "Generation", "HealthCheck", "HealthReport", "ImportResult", "LogEntry", "NameMove", "OmsSignResult",
            "Provisioned", "PushResult", "ReceiveResult",
            "Result", "SignResult", "SignatureCheck", "SignatureReport", "StatementResult", "Status", "Timings", "TokenLogprobs",
            "Transition", "VerifyReport")
_EXPORTS = {
    "Store": "slm.api", "Runtime": "slm.api", "Session": "slm.api", "Conversation": "slm.conversation",
    "Composition": "slm.compose.composition",
    **{name: "slm.ops.results" for name in _RESULTS},  # every typed result (docs/api.md)
    "ExitCode": "slm.errors", "SlmError": "slm.errors", "UsageError": "slm.errors", "NotFound": "slm.errors",
    "InvalidInput": "slm.errors", "IntegrityError": "slm.errors", "Incompatible": "slm.errors",
    "Busy": "slm.errors", "BudgetExceeded": "slm.errors", "NeedsRecovery": "slm.errors",
    "NumericsError": "slm.errors", "Switched": "slm.errors", "IOFailure": "slm.errors",
    "CommittedIncomplete": "slm.errors", "ShuttingDown": "slm.errors", "RollbackRefused": "slm.errors",
    "EquivocationRefused": "slm.errors", "StatementExpired": "slm.errors", "WrongTarget": "slm.errors",
    "Unhealthy": "slm.errors", "InUse": "slm.errors",
    "keep_freed_memory": "slm.model.allocator", "version_info": "slm.ops.about",
}
__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'slm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily
    from slm.api import Runtime, Session, Store  # noqa: F401
    from slm.compose.composition import Composition  # noqa: F401
    from slm.conversation import Conversation  # noqa: F401
    from slm.errors import *  # noqa: F401,F403
    from slm.model.allocator import keep_freed_memory  # noqa: F401
    from slm.ops.about import version_info  # noqa: F401
    from slm.ops.results import *  # noqa: F401,F403
