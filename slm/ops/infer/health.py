"""`slm health`: the health checks of a composition, in order, stopped at the first failure.

    integrity    every blob re-hashed (slm verify's check_integrity)
    certificate  the signed verify certificate given (--certificate FILE), else every one recorded
                 with the composition (slm.ops.ship.certificates) whose key is one of config.toml's
                 trusted_keys (any key, when there are none): each one's signature, its key, its
                 verdict, the oracle numerics again here (slm verify's) and its golden answers
                 again (slm.ops.infer.golden), all of which must pass; none: "skipped"
    generation   a few greedy tokens of a fixed prompt in the runtime's default mode, through the
                 engine as `slm run` generates: non-finite or all-equal logits fail it
    script:NAME  each executable in the store's health.d/ (slm.ops.infer.health_scripts)

Nothing is written to the store: the generations keep their logits, so the prompt cache is not
used. (Re-hashing may refresh the advisory verified-digest cache, which is not store state:
docs/recovery.md.) An error of a check (a composition refused by the signing policy, over the
memory budget, a malformed certificate) fails that check with its one line; only the spec naming
nothing, a busy or damaged store, or Ctrl-C end the command instead.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable

from slm.compose.composition import Composition
from slm.errors import InvalidInput, SlmError
from slm.model import modes
from slm.ops.infer import golden, verify
from slm.ops.infer.health_scripts import DEFAULT_TIMEOUT_S, run_scripts
from slm.ops.infer.loading import Loaded, load_composition
from slm.ops.progress import NoProgress
from slm.ops.results.health import FAILED, PASSED, SKIPPED, HealthCheck, HealthReport
from slm.store import StoreDir
from slm.store import digest as dg

GENERATION_PROMPT = "Once upon a time"
GENERATION_TOKENS = 4
MAX_TIMEOUT_S = 86400.0  # a script's deadline: a day at most


Load = Callable[[], Loaded]  # the composition staged and loaded to run, on first call


class CheckFailed(Exception):
    """A check's verdict: failed, with its one-line reason."""


class Skip(Exception):
    """A check's verdict: nothing to check (skipped), with its one-line reason."""


def _integrity(store: StoreDir, comp: Composition, certificate: Path | None, load: Load) -> str:
    found = verify.check_integrity(store, comp, NoProgress())
    if found["bad_blobs"]:
        raise CheckFailed(f"{len(found['bad_blobs'])} blob(s) missing or corrupt, e.g. {found['bad_blobs'][0]}")
    if not found["ok"]:
        raise CheckFailed(f"prompt-cache entries do not match their digest, e.g. {found['bad_cache_entries'][0]}")
    return f"{found['blobs']} blobs re-hashed"


def _certificates(store: StoreDir, comp: Composition, certificate: Path | None,
                  trusted: tuple[str, ...]) -> list[dict]:
    """The certificates to judge: the file given (whatever its key: an untrusted one fails), or
    those recorded with the composition whose key is trusted (every one, with no trusted_keys).
    Skip when there is none."""
    from slm.ops.ship import certificates

    if certificate is not None:
        cert = certificates.check_certificate(certificate, trusted)  # its signature verifies, or IntegrityError
        if cert["composition_id"] != comp.id:
            raise CheckFailed("the certificate is for another composition")
        if trusted and not cert["trusted"]:
            raise CheckFailed(f"the certificate is signed by key {cert['fingerprint']}, not one of trusted_keys")
        return [cert]
    found = certificates.check_recorded(store, comp.id, trusted)  # each verifies and names comp, or raises
    if not found:
        raise Skip("no certificate given or recorded")
    believed = [c for c in found if c["trusted"] or not trusted]
    if not believed:
        raise Skip(f"{len(found)} recorded certificate(s), none signed by a key of trusted_keys")
    return believed


def _named(cert: dict, reason: str) -> str:
    """A failure's reason, naming the recorded certificate it is about."""
    return f"recorded certificate {dg.short(cert['digest'])}: {reason}" if "digest" in cert else reason


def _certificate(store: StoreDir, comp: Composition, certificate: Path | None, load: Load) -> str:
    """Every certificate judged must pass: each is a signed claim about this composition's
    answers, and one that no longer holds here is what the check is for."""
    from slm.ops.ship.policy import policy

    judged = _certificates(store, comp, certificate, policy(store).trusted_keys)
    for cert in judged:
        result = cert["result"]
        numerics = result.get("numerics")
        if not isinstance(numerics, dict) or numerics.get("ok") is not True:
            raise CheckFailed(_named(cert, "the certificate does not certify passing numerics"))
    here = verify.check_numerics(store, comp)
    if not here["ok"]:
        raise CheckFailed(f"logits differ from the fresh-base oracle here (max abs {here['max_abs_error']:.2e}, "
                          f"top-1 agreement {here['top1_agreement']:.3f})")
    for cert in judged:
        differs = golden.differences(store, load(), cert["result"].get("golden"))
        if differs:
            raise CheckFailed(_named(cert, differs))
    keys = ", ".join(dict.fromkeys(c["fingerprint"] for c in judged))
    what = "certified" if len(judged) == 1 else f"{len(judged)} certificates"
    return f"{what} by key {keys}: oracle numerics and golden answers match"


def _generation(store: StoreDir, comp: Composition, certificate: Path | None, load: Load) -> str:
    loaded = load()
    mode = modes.resolve(False)  # what `slm run` and `slm serve` run in by default
    tokens = golden.generate(store, loaded, GENERATION_PROMPT, GENERATION_TOKENS, mode)
    return f"{len(tokens)} tokens generated ({mode}), logits finite"


BUILT_IN: tuple[tuple[str, Callable[[StoreDir, Composition, Path | None, Load], str]], ...] = (
    ("integrity", _integrity), ("certificate", _certificate), ("generation", _generation))


def _timed(name: str, check: Callable[[], str]) -> HealthCheck:
    start = time.monotonic()
    try:
        status, reason = PASSED, check()
    except Skip as skipped:
        status, reason = SKIPPED, str(skipped)
    except (CheckFailed, SlmError) as err:
        status, reason = FAILED, " ".join(str(err).split())
    return HealthCheck(name, status, reason, round(time.monotonic() - start, 3))


def check_timeout(timeout_s: float) -> float:
    """A health.d script's deadline, checked (InvalidInput): a caller that runs the checks later,
    after changing the store (slm follow's trial), asks this before anything."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not 0 < timeout_s <= MAX_TIMEOUT_S:  # (NaN fails both comparisons)
        raise InvalidInput(f"--timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}")
    return timeout_s


def check_health(store: StoreDir, comp: Composition, *, certificate: Path | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> HealthReport:
    """Run the checks of `comp` in order; the report stops at the first that fails."""
    check_timeout(timeout_s)
    # loaded once for the golden answers and the generation (integrity is checked before either)
    load: Load = functools.cache(lambda: load_composition(store, comp, verify=False))
    checks: list[HealthCheck] = []
    for name, check in BUILT_IN:
        checks.append(_timed(name, lambda check=check: check(store, comp, certificate, load)))
        if checks[-1].status == FAILED:
            return HealthReport(comp.id, tuple(checks))
    for found in run_scripts(store.root, comp.id, timeout_s):
        checks.append(found)
        if found.status == FAILED:
            break
    return HealthReport(comp.id, tuple(checks))
