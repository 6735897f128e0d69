"""A progress seam: operations report, the CLI decides how (or whether) to draw it."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, description: str, total: int) -> None: ...

    def advance(self, amount: int) -> None: ...

    def finish(self) -> None: ...


class NoProgress:
    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass

    def finish(self) -> None:
        pass
