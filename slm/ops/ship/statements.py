"""`slm sign --for REPO:TAG --version N --expires DURATION`: a signed statement for a tag
(slm.distribution.statement), and reading the statements a registry holds for a manifest.

A statement is stored like a signature (slm.ops.ship.signing.add_signature: the composition's
record lists it, the rename of names/compositions/<id> is the commit point), so it counts for
require_signed as the signature of its key, travels in every bundle, and `slm push` sends it as
a referrer of the composition's manifest like every signature; `fetch_statements` reads those
back, for a device that follows the tag.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from slm.ops.results import StatementResult
from slm.store import StoreDir

if TYPE_CHECKING:  # `slm sign` loads no registry client
    from slm.distribution.registry import Registry


def terms(target: str, version: int, expires: str, now: float | None = None) -> tuple[str, str, int, int]:
    """(repository, tag, version, expiry in seconds since the epoch) of `--for`, `--version` and
    `--expires`, each checked (one line, exit 4) before any key is read."""
    from slm.distribution import statement
    from slm.distribution.reference import parse_target

    repository, tag = parse_target(target)
    statement.check_version(version)
    return repository, tag, version, int(time.time() if now is None else now) + statement.parse_duration(expires)


def sign_for(store: StoreDir, ref: str | None, key_path: Path, target: str, version: int,
             expires: str, now: float | None = None) -> StatementResult:
    """Sign `ref` (default: the active composition) as version `version` of `target`
    (REPO:TAG), valid for `expires` (a duration: 30d, 12h, 90m) from now."""
    from slm.distribution import signing, statement
    from slm.ops.ship.signing import add_signature, find

    repository, tag, version, until = terms(target, version, expires, now)
    key = signing.load_private_key(Path(key_path))
    public = signing.public_key_text(key)
    with store.locked():
        comp_id = find(store, ref)
        blob = statement.sign(comp_id, repository, tag, version, until, key)
        signed = add_signature(store, comp_id, blob, public)
    return StatementResult(**vars(signed), repository=repository, tag=tag, version=version,
                           expires=statement.format_time(until))


def fetch_statements(registry: Registry, manifest_digest: str) -> list:
    """The statements among the signature referrers of a manifest, each bounded and matching
    its descriptor: a slm.distribution.statement.Statement, or its blob when it does not parse
    or verify. Not checked against the composition the manifest's config names, nor refused one
    by one: whether any may be followed is check_statements' question, which gives each its own
    verdict (another composition is a mix-and-match, or its key's equivocation when both give
    one version of the tag; a malformed one beside a good one does not hide it). The other
    signatures are judged by the pull (slm.ops.ship.referrers.fetch_referrers)."""
    from slm.distribution import statement
    from slm.errors import IntegrityError, InvalidInput
    from slm.ops.ship import referrers

    blobs = referrers.fetch_unjudged(registry, manifest_digest, referrers.SIGNATURE)
    found: list = []
    for blob in blobs:
        if statement.is_statement(blob):
            try:
                found.append(statement.parse_statement(blob))
            except (IntegrityError, InvalidInput):
                found.append(blob)
    return found
