"""Compositions: base + tokenizer + architecture + quant profile + runtime + ordered adapters.

The identity is a fixed set of fields serialised canonically (docs/concepts.md):

    {"adapters": [{"digest": "blake3:..", "load_order": 1, "weight": "0x1.6666666666666p-1"}],
     "architecture": "blake3:..", "base": "blake3:..", "quant_profile": "q4_1",
     "runtime": {"name": "slm", "version": "0.1.0"}, "schema": "slm.composition/1",
     "tokenizer": "blake3:.."}

JSON with sorted keys and no whitespace; weights spelled as float.hex() so that 0.7, 0.70 and
7e-1 are one value and one spelling. The composition id is BLAKE3 of those bytes. Adapter
names, creation time and provenance sit beside the identity in the TOML manifest, not in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import slm
from slm import numbers
from slm.compose.base_manifest import BaseManifest
from slm.compose.toml_io import dumps, field as req, loads
from slm.errors import Incompatible, InvalidInput
from slm.formats.jsonfile import canonical_json
from slm.store import digest as dg
from slm.store.names import validate_name

SCHEMA = "slm.composition/1"
MAX_SIGNATURES = 64
MAX_CERTIFICATES = 64
MAX_ADAPTERS = 64  # checked before any adapter is loaded or the store is locked
FLOAT32_MAX = 3.4028234663852886e38
# The largest |weight| a composition may give an adapter (docs/concepts.md, "Compositions and
# their identity"): a weight scales a trained delta that moves the base by its whole amount at 1,
# so useful weights lie within a few units of 0; far beyond, the network's activations leave
# float32's range and every logit turns to the same value, an empty answer that looks like an end.
MAX_WEIGHT = 1000.0
# A weight as written is at most this many characters: a float64 needs 17 significant digits, and
# a spec is a name requests repeat (a server's /metrics labels and every answer's `model` carry
# it): "0.5" followed by a megabyte of zeros is the same weight, and would be carried as it is.
MAX_WEIGHT_CHARS = 32
RUNTIME = {"name": "slm", "version": slm.__version__}


@dataclass(frozen=True)
class AdapterRef:
    digest: str
    weight: float
    name: str = ""  # display only; not part of the identity


@dataclass(frozen=True)
class Composition:
    base: str
    tokenizer: str
    architecture: str
    quant_profile: str
    runtime: dict
    adapters: tuple[AdapterRef, ...] = ()
    base_name: str = ""  # display only
    created_at: str = ""  # provenance, not identity
    created_by: str = ""
    # Signature blobs (slm.signature/1) over this composition's id: beside the identity, not in
    # it, so signing never changes the id it signs.
    signatures: tuple[str, ...] = ()
    # Signed verify certificates (slm.certificate/1) of this composition, beside the identity
    # too; never signatures: require_signed does not count them.
    certificates: tuple[str, ...] = ()

    def identity(self) -> dict:
        return {
            "schema": SCHEMA,
            "base": self.base,
            "tokenizer": self.tokenizer,
            "architecture": self.architecture,
            "quant_profile": self.quant_profile,
            "runtime": {"name": self.runtime["name"], "version": self.runtime["version"]},
            "adapters": [
                {"digest": a.digest, "load_order": i + 1, "weight": float(a.weight).hex()}
                for i, a in enumerate(self.adapters)
            ],
        }

    @property
    def id(self) -> str:
        return dg.of_bytes(canonical_json(self.identity()))

    def to_toml(self) -> bytes:
        return dumps({
            "schema": SCHEMA,
            "base": self.base,
            "base_name": self.base_name,
            "tokenizer": self.tokenizer,
            "architecture": self.architecture,
            "quant_profile": self.quant_profile,
            "runtime": dict(self.runtime),
            "adapters": self.adapter_list(),
            "provenance": {"created_at": self.created_at, "created_by": self.created_by},
            **({"signatures": list(self.signatures)} if self.signatures else {}),
            **({"certificates": list(self.certificates)} if self.certificates else {}),
        })

    def adapter_list(self) -> list[dict]:
        """The adapters as the manifest and `slm show` list them: name, digest, load order and
        weight (as a plain number; the identity spells it float.hex())."""
        return [{"name": a.name, "digest": a.digest, "load_order": i + 1, "weight": a.weight}
                for i, a in enumerate(self.adapters)]
    def with_signatures(self, signatures) -> "Composition":
        """The same composition (same id, same provenance) with another list of signatures."""
        return replace(self, signatures=tuple(signatures))

    def with_certificates(self, certificates) -> "Composition":
        """The same composition (same id, same provenance) with another list of certificates."""
        return replace(self, certificates=tuple(certificates))

    def for_runtime(self, runtime: dict) -> "Composition":
        """The same base, adapters, weights and order under another runtime: another identity
        (the identity names the runtime that verified it)."""
        return Composition(self.base, self.tokenizer, self.architecture, self.quant_profile,
                           {"name": runtime["name"], "version": runtime["version"]}, self.adapters,
                           self.base_name)

    def with_adapters(self, adapters) -> "Composition":
        return Composition(self.base, self.tokenizer, self.architecture, self.quant_profile,
                           self.runtime, tuple(adapters), self.base_name)


def architecture_digest(base: BaseManifest) -> str:
    """The architecture id: hyperparameters plus the q/k row layout, canonically hashed."""
    return dg.of_bytes(canonical_json({"architecture": base.architecture,
                                       "qk_row_layout": base.qk_row_layout}))


def for_base(base_digest: str, base: BaseManifest, base_name: str = "") -> Composition:
    return Composition(
        base=base_digest,
        tokenizer=base.tokenizer_digest,
        architecture=architecture_digest(base),
        quant_profile=base.quant_profile,
        runtime=dict(RUNTIME),
        base_name=base_name,
    )


def stamped(c: Composition, created_by: str) -> Composition:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Composition(c.base, c.tokenizer, c.architecture, c.quant_profile, c.runtime,
                       c.adapters, c.base_name, now, created_by)


def parse_weight(text: str, where: str) -> float:
    """An adapter's weight as a user writes it (`NAME@WEIGHT` on the command line,
    `BASE+NAME@WEIGHT` in a server request): slm.numbers' DECIMAL, then check_usable_weight."""
    if len(text) > MAX_WEIGHT_CHARS:
        raise InvalidInput(f"{where}: weight {text[:MAX_WEIGHT_CHARS]!r}... is {len(text)} characters; a weight is "
                           f"written in at most {MAX_WEIGHT_CHARS}")
    if not numbers.is_decimal(text):
        raise InvalidInput(f"{where}: weight {text!r} is not a number ({numbers.DECIMAL_GRAMMAR})")
    return check_usable_weight(float(text), where)


def check_usable_weight(weight, where: str) -> float:
    """A weight a composition may be made or activated with: check_weight's, and |w| <=
    MAX_WEIGHT. (A stored composition is read with check_weight alone, so that one beyond the
    bound still lists, logs and collects; activating it is refused.)"""
    weight = check_weight(weight, where)
    if abs(weight) > MAX_WEIGHT:
        raise InvalidInput(f"{where}: weight {weight:g} is beyond the weight bound (|w| <= {MAX_WEIGHT:g}): "
                           "so large a weight overflows the network's float32 arithmetic")
    return weight


def check_weight(weight, where: str) -> float:
    """A finite weight in the precision the overlays use it in: float32 (1e39 is a finite
    double and an infinite float32)."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise InvalidInput(f"{where}: weight {weight!r} is not a finite number")
    if abs(weight) > FLOAT32_MAX:
        raise InvalidInput(f"{where}: weight {weight!r} is beyond float32 range (|w| <= 3.4e38)")
    return float(weight)


def check_adapter_list(adapters, what: str) -> None:
    """The cheap checks of an adapter list, made before anything is loaded or locked: how many,
    and no adapter twice (10,000 copies of one adapter are refused at once, not after loading
    each copy under the store lock)."""
    if len(adapters) > MAX_ADAPTERS:
        raise Incompatible(f"{what}: {len(adapters)} adapters; a composition stacks at most {MAX_ADAPTERS}")
    seen: set[str] = set()
    for a in adapters:
        if a.digest in seen:
            raise Incompatible(f"{what}: adapter {a.name or dg.short(a.digest)} appears twice")
        seen.add(a.digest)


def _display_name(value, where: str) -> str:
    """A name carried in a manifest follows the same rules as one typed on the command line
    (so a manifest cannot smuggle terminal escapes into `slm status`); empty means unnamed."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str):
        raise InvalidInput(f"{where}: name must be a string")
    return validate_name(value)


# the keys a composition manifest holds (to_toml writes them): any other is refused, not ignored,
# so that a manifest given with `activate -f` or received in a bundle does all it says
_KEYS = {"schema", "base", "base_name", "tokenizer", "architecture", "quant_profile", "runtime", "adapters",
         "provenance", "signatures", "certificates"}
_TABLE_KEYS = {"runtime": {"name", "version"}, "provenance": {"created_at", "created_by"},
               "adapters": {"name", "digest", "load_order", "weight"}}


def _only_known(table: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise InvalidInput(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def parse_composition(data: bytes, what: str = "composition manifest") -> Composition:
    doc = loads(data, what)
    if doc.get("schema") != SCHEMA:
        raise InvalidInput(f"{what}: schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    _only_known(doc, _KEYS, what)
    for key in ("runtime", "provenance"):
        if isinstance(doc.get(key), dict):
            _only_known(doc[key], _TABLE_KEYS[key], f"{what} [{key}]")
    digests = {}
    for key in ("base", "tokenizer", "architecture"):
        value = req(doc, key, str, what)
        if not dg.is_digest(value):
            raise InvalidInput(f"{what}: {key} {value!r} is not a blake3 digest")
        digests[key] = value
    runtime = req(doc, "runtime", dict, what)
    for key in ("name", "version"):
        req(runtime, key, str, f"{what} [runtime]")
    adapters = []
    entries = req(doc, "adapters", list, what)
    if len(entries) > MAX_ADAPTERS:
        raise Incompatible(f"{what}: {len(entries)} adapters; a composition stacks at most {MAX_ADAPTERS}")
    for i, entry in enumerate(entries):
        where = f"{what} adapters[{i}]"
        if not isinstance(entry, dict):
            raise InvalidInput(f"{where}: not a table")
        _only_known(entry, _TABLE_KEYS["adapters"], where)
        digest = req(entry, "digest", str, where)
        if not dg.is_digest(digest):
            raise InvalidInput(f"{where}: digest {digest!r} is malformed")
        order = req(entry, "load_order", int, where)
        if order != i + 1:
            raise InvalidInput(f"{where}: load_order {order} out of sequence (expected {i + 1})")
        weight = check_weight(req(entry, "weight", (int, float), where), where)
        adapters.append(AdapterRef(digest, weight, _display_name(entry.get("name"), where)))
    check_adapter_list(adapters, what)
    signatures = _digest_list(doc, "signatures", MAX_SIGNATURES, what)
    certificates = _digest_list(doc, "certificates", MAX_CERTIFICATES, what)
    provenance = doc.get("provenance", {}) if isinstance(doc.get("provenance"), dict) else {}
    return Composition(
        base=digests["base"],
        tokenizer=digests["tokenizer"],
        architecture=digests["architecture"],
        quant_profile=req(doc, "quant_profile", str, what),
        runtime={"name": runtime["name"], "version": runtime["version"]},
        adapters=tuple(adapters),
        base_name=_display_name(doc.get("base_name"), f"{what} base_name"),
        created_at=str(provenance.get("created_at", "")),
        created_by=str(provenance.get("created_by", "")),
        signatures=signatures,
        certificates=certificates,
    )


def _digest_list(doc: dict, key: str, limit: int, what: str) -> tuple[str, ...]:
    """A record's list of blob digests (signatures, certificates), each once."""
    value = doc.get(key, [])
    if not isinstance(value, list) or len(value) > limit or not all(isinstance(s, str) and dg.is_digest(s)
                                                                    for s in value):
        raise InvalidInput(f"{what}: {key} must be a list of at most {limit} blake3 digests")
    return tuple(dict.fromkeys(value))
