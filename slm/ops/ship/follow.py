"""`slm follow REF`: one round of a device that follows a registry tag (docs/fleet.md).

    resolve   the tag's manifest (its digest); a digest marked bad ends the round (known-bad)
    judge     the signed statements the registry holds for that manifest
              (slm.distribution.statement.check_statements against the version running, the
              store's trusted_keys, the clock): a refusal ends the round, nothing written; a
              higher version of the composition marked good is recorded as its version (no trial)
    pull      by digest (so the tag cannot move between judging and receiving): a receive
              transaction, verified, the store's signing policy judged before anything arrives
    stage     the trial recorded in follow/state.json (slm.ops.ship.follow_state)
    activate  the trial made active (slm activate's transaction), unless nothing was active
              before it: then there is nothing to roll back to, and it is checked first
    health    slm health's checks (slm.ops.infer.health)
    mark      good: the state's good is the trial (THE END OF THE ROUND); failed: the failure
              recorded, the last good composition (else the one active before) made active
              again, the trial marked bad: never followed again until an operator clears it

A follower that finds a trial in the state when it starts died during it (kill -9, a power
cut, an OOM kill: a composition that crashes its host): it counts the death, resumes the
trial's checks, and after `max_trial_deaths` (config.toml [follow], default 3) rolls it back
and marks it bad, the boot-count rule of U-Boot and greenboot.

Each round runs under the follower's own lock (an flock of the store's directory, held for the
follower's life), so two followers never share a store; the store lock is held only while a
step writes.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from contextlib import contextmanager
from typing import Iterator

from slm.distribution.reference import Reference, parse_reference
from slm.errors import Busy, Incompatible, InvalidInput, IOFailure, NotFound
from slm.ops.infer import compositions
from slm.ops.infer.health import check_health
from slm.ops.infer.health_scripts import DEFAULT_TIMEOUT_S
from slm.ops.results import FollowRound, HealthReport
from slm.ops.results.health import SKIPPED
from slm.ops.ship import follow_state as fstate
from slm.ops.ship.follow_state import Followed, FollowState, Trial
from slm.ops.store import activation
from slm.store import StoreDir, fs
from slm.store import digest as dg
from slm.store.config import follow_settings
from slm.store.lock import held_elsewhere

UPDATED, CURRENT, ROLLED_BACK, KNOWN_BAD = "updated", "current", "rolled-back", "known-bad"


def target(reference: str, state: FollowState | None = None) -> Reference:
    """REF as a follower takes it: a registry tag (a digest names no version to follow)."""
    ref = parse_reference(reference)
    if ref.digest is not None:
        raise InvalidInput(f"{reference}: follow a tag (host/repo:tag), not a digest")
    ref = dataclasses.replace(ref, tag=ref.ref)
    if state is not None and state.reference not in (None, str(ref)):
        raise InvalidInput(f"this store follows {state.reference}, not {ref}; "
                           "`slm follow --forget` first to follow another tag")
    return ref


def trusted_keys(store: StoreDir) -> tuple[str, ...]:
    """The keys a statement is believed under: config.toml's trusted_keys (none: exit 6)."""
    from slm.ops.ship.policy import policy

    trusted = tuple(policy(store).trusted_keys)
    if not trusted:
        raise Incompatible("following a tag needs the publisher's key in config.toml's trusted_keys: "
                           "a statement is believed only under a trusted key")
    return trusted


@contextmanager
def follower(store: StoreDir) -> Iterator[None]:
    """The follower's lock for its whole life: an flock of the store's directory itself (no
    file to create: a refused first round leaves the store as it was), which the kernel drops
    when the follower dies. A second follower of the store is refused (exit 7)."""
    fd = _open_root(store)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            raise Busy("another follower runs on this store") from err
        yield
    finally:
        os.close(fd)


def is_following(store: StoreDir) -> bool:
    """Whether a follower holds the store's follow lock now (this process's own included: the
    lock is asked through another open file, which flock tells apart)."""
    try:
        fd = _open_root(store)
    except IOFailure:
        return False
    try:
        return held_elsewhere(fd)
    finally:
        os.close(fd)


def _open_root(store: StoreDir) -> int:
    try:
        return os.open(store.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise IOFailure(f"cannot open the store {store.root}: {err.strerror or err}") from err


def roll_back_interrupted(store: StoreDir) -> None:
    """`slm fsck --repair` of a trial no follower runs: rolled back and marked bad."""
    with store.locked():
        state = fstate.read(store)
        if state.trial is not None:
            _roll_back(store, state, state.trial.failed or "interrupted: rolled back by `slm fsck --repair`")


def resume(store: StoreDir, reference: str, *, died: bool = True,
           timeout_s: float = DEFAULT_TIMEOUT_S) -> FollowRound | None:
    """A trial left in the state: at a follower's start (`died`), a death during it, counted,
    then the trial resumed, or rolled back and marked bad once the deaths reach
    max_trial_deaths; later in a follower's life, a trial an error interrupted (the store
    busy, the memory budget), resumed. None if no trial is pending."""
    state = fstate.read(store)
    trial = state.trial
    if trial is None:
        return None
    ref = target(reference, state)
    if trial.failed is not None:  # it failed its checks; the roll-back was interrupted
        return _roll_back(store, state, trial.failed)
    if not died:
        return _trial(store, state, str(ref), timeout_s)
    deaths = trial.deaths + 1
    counted = dataclasses.replace(state, trial=dataclasses.replace(trial, deaths=deaths))
    fstate.write(store, state, counted, "follow-death")
    limit = follow_settings(store.config)["max_trial_deaths"]
    if deaths >= limit:
        return _roll_back(store, counted, f"the follower died {deaths} times during its trial")
    return _trial(store, counted, str(ref), timeout_s)


def follow_round(store: StoreDir, reference: str, *, insecure: bool = False, now: float | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> FollowRound:
    """One round (run it inside `follower`, after `resume`). Raises the refusal's typed error
    (statement refusals 14-17, signing policy 6, integrity 5, registry 12) with nothing written."""
    from slm.distribution import statement
    from slm.distribution.bundle import parse_manifest, sha256_of
    from slm.distribution.registry import Registry
    from slm.ops.ship import referrers
    from slm.ops.ship.statements import fetch_statements

    state = fstate.read(store)
    ref = target(reference, state)
    trusted = trusted_keys(store)
    if state.trial is not None:
        raise InvalidInput("a trial is pending: the follower resumes it when it starts")
    registry = Registry(ref, insecure)
    try:
        data = registry.get_manifest(ref.tag)
        if data is None:
            raise NotFound(f"registry {ref.host}: no manifest {ref.repository}:{ref.tag}")
        digest = sha256_of(data)
        fs.point("follow.resolved")
        bad = state.is_bad(digest)
        if bad is not None:
            return _ended(store, state, str(ref), KNOWN_BAD,
                          f"{ref} names {digest[:19]}, marked bad: {bad.reason}")
        manifest = parse_manifest(data, f"{ref} manifest")
        comp_id = referrers.composition_of(registry, manifest, digest)
        if state.is_bad(digest, comp_id) is not None:
            return _ended(store, state, str(ref), KNOWN_BAD, f"{ref} names {dg.short(comp_id)}, marked bad")
        good = state.good
        verdict = statement.check_statements(
            fetch_statements(registry, digest), repository=ref.repository, tag=ref.tag,
            now=time.time() if now is None else now, trusted_keys=trusted, composition=comp_id,
            running=None if good is None else (good.version, good.composition))
        signed = verdict.raise_if_refused()
    finally:
        registry.close()
    if verdict.reason is statement.Reason.CURRENT:
        _keep_active(store, good.composition)
        return _ended(store, state, str(ref), CURRENT, verdict.message)
    if good is not None and comp_id == good.composition:
        # a higher version of what runs (a statement re-signed to refresh it): recorded, so that
        # the lower ones are rollbacks from now on; no trial (it passed its checks, and a check
        # that fails now must not mark the running composition bad)
        _keep_active(store, good.composition)
        bumped = dataclasses.replace(state, reference=str(ref), good=Followed(comp_id, digest, signed.version))
        fstate.write(store, state, bumped, "follow-version")
        return _ended(store, bumped, str(ref), CURRENT,
                      f"version {signed.version} of {ref} names {dg.short(comp_id)}, which runs: recorded")
    from slm.ops.ship import registry_ops

    pinned = dataclasses.replace(ref, tag=None, digest=digest)
    pulled = registry_ops.pull(store, str(pinned), insecure)
    fs.point("follow.pulled")
    if pulled.composition_id != comp_id:  # the receive verified what the config names
        raise Incompatible(f"{ref}: received {dg.short(pulled.composition_id)}, not the composition signed for")
    trial = Trial(comp_id, digest, signed.version, previous=store.active_ref.read())
    staged = dataclasses.replace(state, reference=str(ref), trial=trial)
    compositions.stage(store, compositions.load(store, comp_id), load_overlays=False)
    fstate.write(store, state, staged, "follow-stage")
    fs.point("follow.staged")
    return _trial(store, staged, str(ref), timeout_s)


def _trial(store: StoreDir, state: FollowState, reference: str, timeout_s: float) -> FollowRound:
    """Activate the trial (when there is something to roll back to), check it, mark it."""
    trial = state.trial
    comp = compositions.load(store, trial.composition)
    rollback_target = _rollback_target(state)
    if rollback_target is not None:
        activation.switch(store, comp, "follow-trial")
        fs.point("follow.activated")
    report = check_health(store, comp, timeout_s=timeout_s)
    fs.point("follow.checked")
    why = _verdict(store, report)
    if why is not None:
        marked = dataclasses.replace(state, trial=dataclasses.replace(trial, failed=why[:fstate.MAX_REASON]))
        fstate.write(store, state, marked, "follow-failed")
        return _roll_back(store, marked, why, report)
    if rollback_target is None:
        activation.switch(store, comp, "follow")
    good = Followed(trial.composition, trial.manifest, trial.version)
    fstate.write(store, state, dataclasses.replace(state, good=good, trial=None), "follow-good")
    fs.point("follow.marked")
    return FollowRound(reference, UPDATED, trial.composition, trial.version, trial.manifest,
                       f"version {trial.version} ({dg.short(trial.composition)}) passed its health checks: marked good",
                       report)


def _verdict(store: StoreDir, report: HealthReport) -> str | None:
    """Why the trial fails (None: it passes): a failed check, or, under [follow]
    require_certificate, a certificate check that found nothing to judge."""
    if not report.healthy:
        return f"the {report.failed.name} check failed: {report.failed.reason}"
    certificate = next((c for c in report.checks if c.name == "certificate"), None)
    if follow_settings(store.config)["require_certificate"] and certificate is not None \
            and certificate.status == SKIPPED:
        return f"no certificate to check ({certificate.reason}), and [follow] require_certificate is set"
    return None


def _rollback_target(state: FollowState) -> str | None:
    return state.good.composition if state.good is not None else state.trial.previous


def _roll_back(store: StoreDir, state: FollowState, why: str, report=None) -> FollowRound:
    """Make the last good composition (else the one before the trial) active again, then mark
    the trial bad: in this order, so that a crash between them leaves the failure recorded and
    the next start finishes the roll-back."""
    trial = state.trial
    back = _rollback_target(state)
    if back is not None and store.active_ref.read() != back:
        activation.switch(store, compositions.load(store, back), "follow-rollback")
    fstate.write(store, state, state.with_bad(trial, why), "follow-bad")
    fs.point("follow.marked")
    return FollowRound(state.reference or "", ROLLED_BACK, back, None if state.good is None else state.good.version,
                       None if state.good is None else state.good.manifest,
                       f"version {trial.version} ({dg.short(trial.composition)}) rolled back and marked bad: {why}",
                       report)


def _keep_active(store: StoreDir, good: str) -> None:
    """The tag still names the good composition: it is what runs (made active again if an
    operator or an interrupted step left another)."""
    if store.active_ref.read() != good:
        activation.switch(store, compositions.load(store, good), "follow")


def _ended(store: StoreDir, state: FollowState, reference: str, outcome: str, message: str) -> FollowRound:
    good = state.good
    return FollowRound(reference, outcome, store.active_ref.read(), None if good is None else good.version,
                       None if good is None else good.manifest, message, None)


MIN_PREFIX = 12  # hex digits of a digest named by its beginning, as --status shows them


def _names(bad: fstate.Bad, digest: str) -> bool:
    """Whether `digest` names the bad mark: its manifest digest or composition id, whole, or
    their first MIN_PREFIX or more hex digits (with or without the algorithm)."""
    text = digest.lower()
    if text in (bad.manifest, bad.composition):
        return True
    hex_part = text.split(":", 1)[-1]
    return len(hex_part) >= MIN_PREFIX and any(
        full.startswith(text) if ":" in text else full.split(":", 1)[1].startswith(text)
        for full in (bad.manifest, bad.composition))


def clear_bad(store: StoreDir, digest: str | None = None) -> int:
    """Forget the bad marks (all, or those a manifest digest / composition id names, whole or
    by the beginning --status shows): the tag's composition is followed again. Returns how many
    were cleared; NotFound if `digest` names none."""
    with store.locked():
        state = fstate.read(store)
        kept = tuple(b for b in state.bad if digest is not None and not _names(b, digest))
        if digest is not None and len(kept) == len(state.bad):
            raise NotFound(f"no bad mark has the manifest digest or composition id {digest[:80]!r} "
                           "(`slm follow --status` lists them)")
        if len(kept) != len(state.bad):
            fstate.write(store, state, dataclasses.replace(state, bad=kept), "follow-clear")
        return len(state.bad) - len(kept)


def forget(store: StoreDir) -> None:
    """Forget the followed tag, its versions and its bad marks (the active composition stays)."""
    if is_following(store):
        raise Busy("a follower runs on this store: stop it first")
    with store.locked():
        state = fstate.read(store)
        if state.trial is not None:
            raise InvalidInput("a trial is pending: let the follower finish it, or `slm fsck --repair`")
        if state != FollowState():
            fstate.write(store, state, FollowState(), "follow-forget")
