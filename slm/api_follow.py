"""The public API's verbs of a device that follows a registry tag (docs/fleet.md), mixed into
slm.api.Store: follow, follow_status, follow_clear_bad, follow_forget, follow_as_asked."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

from slm.api_arguments import checked
from slm.errors import SlmError, UsageError

if TYPE_CHECKING:
    from slm.ops.results import FollowRound, FollowStatus


@checked
class StoreFollow:
    """Following a registry tag (slm.ops.ship.follow, slm.ops.ship.follow_loop)."""

    def follow(self, reference: str, *, insecure: bool = False, interval: str | None = None, once: bool = False,
               timeout_s: float = 60.0, on_round: Callable[[FollowRound | None, SlmError | None], None] | None = None,
               stop: threading.Event | None = None,
               on_start: Callable[[], None] | None = None) -> FollowRound | None:
        """Follow a registry tag (docs/fleet.md): each round resolves it, judges its signed
        statements, pulls, activates a new version as a trial, runs the health checks, and marks
        it good or rolls it back and marks it bad. `once`: one round, returned (its refusal
        raised as its typed error). Otherwise rounds every `interval` (a duration; default
        config.toml's [follow] interval) until `stop` is set, each reported to `on_round`.
        `on_start`: called once this follower holds the store's follow lock, before its first
        round (what refuses to start is raised before it: a thread running this can wait for it)."""
        from slm.ops.ship import follow_loop

        return follow_loop.run(self._s, reference, insecure=insecure, interval=interval, once=once,
                               timeout_s=timeout_s, on_round=on_round, stop=stop, on_start=on_start)

    def follow_status(self) -> FollowStatus:
        """The followed tag, what is good, on trial and bad, and the last round's report."""
        from slm.ops.ship import follow_loop

        return follow_loop.status(self._s)

    def follow_clear_bad(self, digest: str | None = None) -> int:
        """Forget the bad marks (all, or one manifest digest or composition id): followed again."""
        from slm.ops.ship import follow

        return follow.clear_bad(self._s, digest)

    def follow_forget(self) -> None:
        """Forget the followed tag, its versions and bad marks (what is active stays)."""
        from slm.ops.ship import follow_loop

        follow_loop.forget(self._s)

    def follow_as_asked(self, reference: str | None, *, status: bool = False, clear_bad: bool = False,
                        digest: str | None = None, forget: bool = False, insecure: bool = False,
                        interval: str | None = None, once: bool = False, timeout_s: float = 60.0,
                        on_round: Callable[[FollowRound | None, SlmError | None], None] | None = None,
                        stop: threading.Event | None = None) -> object:
        """`slm follow`'s options as one call: --status, --clear-bad [--digest], --forget (each
        alone), else follow `reference` (the other options: those of `follow`). The result: a
        FollowStatus, {"cleared": n}, {"forgotten": true}, or follow's (a FollowRound with `once`)."""
        actions = [n for n, on in (("--status", status), ("--clear-bad", clear_bad), ("--forget", forget)) if on]
        if len(actions) > 1:
            raise UsageError(f"give one of {', '.join(actions)}")
        if digest is not None and not clear_bad:
            raise UsageError("--digest goes with --clear-bad")
        if status:
            return self.follow_status()
        if clear_bad:
            return {"cleared": self.follow_clear_bad(digest)}
        if forget:
            self.follow_forget()
            return {"forgotten": True}
        if reference is None:
            raise UsageError("name the registry tag to follow (HOST[:PORT]/REPO:TAG)")
        return self.follow(reference, insecure=insecure, interval=interval, once=once, timeout_s=timeout_s,
                           on_round=on_round, stop=stop)
