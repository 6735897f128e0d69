"""The public API's verbs on names (refs with a history: docs/cli.md, "Names"), mixed into
slm.api.Store: tag, rm, mv, name_log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slm.api_arguments import checked
from slm.compose.composition import Composition

if TYPE_CHECKING:
    from slm.ops.results import LogEntry, NameMove


@checked
class StoreNames:
    """Names of a Store: each a movable pointer with its own reflog (slm.ops.store.naming)."""

    def tag(self, name: str, spec: Composition | str) -> NameMove:
        """Name a composition (validated as activating it would be); an existing tag moves."""
        from slm.ops.store import naming

        return naming.tag(self._s, name, spec if isinstance(spec, Composition) else self.composition(spec))

    def rm(self, name: str, force: bool = False) -> NameMove:
        """Remove a name; its history stays (`name_log`), its objects until gc expires it. A
        base or adapter the active composition, a tag or a pulled reference uses raises InUse
        unless `force`."""
        from slm.ops.store import naming

        return naming.rm(self._s, name, force)

    def mv(self, old: str, new: str) -> list[NameMove]:
        """Rename: `new` takes `old`'s object, then `old` goes."""
        from slm.ops.store import naming

        return naming.mv(self._s, old, new)

    def name_log(self, name: str) -> list[LogEntry]:
        """Every move of a name, newest first (`slm log NAME`)."""
        from slm.ops.store import naming

        return naming.history(self._s, name)
