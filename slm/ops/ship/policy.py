"""The store's signing policy and the check every switch, and every pull before it receives
anything, makes against it (slm.ops.ship.signing signs and verifies; it loads only where a
signature is touched: an activation of a store that does not require signatures never imports it).

Policy, in the store's config.toml (top level, above the first [table] line; slm.store.config
refuses the keys anywhere else, so a misplaced one cannot leave the policy off):

    require_signed = true
    trusted_keys = ["ed25519:<base64>", "ecdsa-p256:<base64 DER>", ...]

(an ecdsa-p256/p384/p521 key is an OpenSSF Model Signing signer's: slm.distribution.oms)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slm.compose.composition import Composition
from slm.errors import Incompatible, InvalidInput
from slm.store import StoreDir
from slm.store import digest as dg


@dataclass(frozen=True)
class Policy:
    require_signed: bool
    trusted_keys: tuple[str, ...]


def policy(store: StoreDir) -> Policy:
    config = store.config
    required = config.get("require_signed", False)
    keys = config.get("trusted_keys", [])
    if not isinstance(required, bool):
        raise InvalidInput("config.toml: require_signed must be true or false")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise InvalidInput('config.toml: trusted_keys must be a list of "ed25519:<base64>" '
                           '(or "ecdsa-p256:<base64>") strings')
    if keys:  # every switch asks for the policy; the key parser loads only when there are keys
        from slm.distribution import signing

        for i, key in enumerate(keys):
            signing.parse_public_key(key, f"config.toml trusted_keys[{i}]")
    return Policy(required, tuple(keys))


def enforce(store: StoreDir, comp: Composition) -> None:
    """Refuse `comp` if the store requires signatures and none from a trusted key verifies.
    Called by every switch before anything is written, and by slm.ops.infer.loading before any
    weights are loaded to run (slm run, verify's numerics, the API's sessions, the server)."""
    admit(store, comp.id)


def admit(store: StoreDir, comp_id: str, arriving: Sequence[bytes] = ()) -> None:
    """The rule of require_signed: refuse composition `comp_id` (Incompatible) unless the store
    requires no signatures, or one of its signatures verifies under a trusted key, among those
    the store lists with it and `arriving` (the signature blobs that would come with it: a pull
    asks this before it receives anything, slm.ops.ship.registry_ops)."""
    rules = policy(store)
    if not rules.require_signed:
        return
    from slm.ops.ship.signing import check_signature, check_signatures  # what signing needs loads only when it is required

    checks = check_signatures(store, comp_id, rules.trusted_keys)
    known = {c.digest for c in checks}
    for blob in arriving:
        digest = dg.of_bytes(blob)
        if digest not in known:
            known.add(digest)
            checks.append(check_signature(digest, lambda b=blob: b, comp_id, rules.trusted_keys))
    if any(c.valid and c.trusted for c in checks):
        return
    short = dg.short(comp_id)
    if not checks:
        raise Incompatible(f"composition {short} is not signed, and this store requires signed "
                           "compositions (require_signed in config.toml)")
    valid = [c for c in checks if c.valid]
    if valid:
        raise Incompatible(f"composition {short} is signed only by untrusted keys "
                           f"({', '.join(c.fingerprint for c in valid)}); add the signer's key to "
                           "trusted_keys in config.toml, or sign it with a trusted key")
    raise Incompatible(f"composition {short}: no signature verifies ({checks[0].problem})")
