"""Signed statements for a tag: "composition C is version N of REPO:TAG until time T", the
signed input of a device that follows a registry tag (docs/distribution.md, "Statements for a
tag"). The update-system guarantees of TUF, for one tag: the version refuses a rollback and an
equivocation, the expiry a freeze, the repository and tag a mix-and-match.

A statement blob (a signature blob of the composition: media type SIGNATURE, stored and pushed
with its signatures), canonical JSON:

    {"algorithm": "ed25519", "composition": "blake3:<id>", "expires": "2027-01-06T22:00:00Z",
     "public_key": "ed25519:<base64>", "repository": "fleet/support", "schema": "slm.statement/1",
     "signature": "<base64 of 64 bytes>", "tag": "prod", "version": 7}

What is signed is the canonical JSON of every field but algorithm, public_key and signature,
as for slm.signature/1; its own schema string keeps a statement from being read as a plain
signature by a verifier that knows only slm.signature/1 (it refuses the document), and a plain
signature from being taken for a statement.

An OpenSSF Model Signing signature carries the same five fields (`fields`) in its in-toto
predicate, under slm.distribution.oms.TAG_STATEMENT; recorded in the store (slm.oms-signature/1)
it is a statement under the signer's EC key, for the composition of the bundle it signs.

`check_statement` is pure: no network, no store, the clock and the running version given.
"""

from __future__ import annotations

import calendar
import enum
import re
import time
from dataclasses import dataclass

from slm.distribution import oms
from slm.distribution.bundle import MAX_SIGNATURE_BYTES
from slm.distribution.reference import is_repository, is_tag
from slm.errors import (EquivocationRefused, Incompatible, IntegrityError, InvalidInput, RollbackRefused, SlmError,
                        StatementExpired, WrongTarget)
from slm.formats.jsonfile import parse_json_object
from slm.store import digest as dg

SCHEMA = "slm.statement/1"
OMS_FIELDS = frozenset({"composition", "repository", "tag", "version", "expires"})  # in an OMS predicate
FIELDS = OMS_FIELDS | {"schema", "algorithm", "public_key", "signature"}
MAX_STATEMENT_BYTES = 4 << 10  # slm's is a few hundred bytes (an OMS one lists files: MAX_SIGNATURE_BYTES)
MAX_VERSION = (1 << 53) - 1  # exact in every JSON reader (a double's integers)
MAX_DURATION_S = 366 * 86400  # a statement that never expires would make a freeze undetectable
_UNITS = {"d": 86400, "h": 3600, "m": 60}
_DURATION = re.compile(r"([1-9][0-9]{0,6})([dhm])")
_EXPIRES = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})Z")


@dataclass(frozen=True)
class Statement:
    composition: str
    repository: str
    tag: str
    version: int
    expires: int  # seconds since the epoch, UTC
    public_key: str

    @property
    def expires_text(self) -> str:
        return format_time(self.expires)


class Reason(enum.Enum):
    """A verdict's reason; each refusal has its own error class and exit code (docs/exit-codes.md)."""

    NEWER = "newer"  # accepted: a version above the one running (or nothing running): update
    CURRENT = "current"  # accepted: the version and composition running: nothing to do
    MALFORMED = "malformed"  # 4
    BAD_SIGNATURE = "bad-signature"  # 5
    MISSING = "missing"  # 6: no statement at all (as require_signed refuses an unsigned composition)
    UNTRUSTED = "untrusted"  # 6
    WRONG_TARGET = "wrong-target"  # 17: mix-and-match
    EXPIRED = "expired"  # 16: freeze
    ROLLBACK = "rollback"  # 14
    EQUIVOCATION = "equivocation"  # 15


_ERRORS: dict[Reason, type[SlmError]] = {
    Reason.MALFORMED: InvalidInput, Reason.BAD_SIGNATURE: IntegrityError, Reason.MISSING: Incompatible,
    Reason.UNTRUSTED: Incompatible,
    Reason.WRONG_TARGET: WrongTarget, Reason.EXPIRED: StatementExpired, Reason.ROLLBACK: RollbackRefused,
    Reason.EQUIVOCATION: EquivocationRefused,
}


@dataclass(frozen=True)
class Verdict:
    reason: Reason
    message: str
    statement: Statement | None = None  # None when the bytes were not a statement that verifies

    @property
    def accepted(self) -> bool:
        return self.reason in (Reason.NEWER, Reason.CURRENT)

    def error(self) -> SlmError | None:
        """The typed error of a refusal (its exit code is the refusal's), None if accepted."""
        return None if self.accepted else _ERRORS[self.reason](self.message)

    def raise_if_refused(self) -> Statement:
        err = self.error()
        if err is not None:
            raise err
        return self.statement


def parse_duration(text: str) -> int:
    """`--expires`: `30d`, `12h`, `90m` in seconds, at most MAX_DURATION_S."""
    m = _DURATION.fullmatch(text) if text.isascii() else None
    seconds = int(m.group(1)) * _UNITS[m.group(2)] if m else 0
    if not m or seconds > MAX_DURATION_S:
        raise InvalidInput(f"--expires {text[:40]!r}: expected a duration like 30d, 12h or 90m, "
                           f"of at most {MAX_DURATION_S // 86400}d")
    return seconds


def format_time(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _parse_time(text, what: str) -> int:
    m = _EXPIRES.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise InvalidInput(f"{what}: expires is not a UTC time YYYY-MM-DDTHH:MM:SSZ")
    try:  # a year 0, a month 0 or 13: outside what timegm counts from
        epoch = calendar.timegm(tuple(int(g) for g in m.groups()))
    except ValueError:
        epoch = None
    if epoch is None or format_time(epoch) != text:  # 2027-02-30 or 25:00 normalised into another day
        raise InvalidInput(f"{what}: expires {text!r} is not a real time")
    return epoch


def check_version(version, what: str = "--version") -> int:
    if type(version) is not int or not 1 <= version <= MAX_VERSION:
        shown = "a larger one" if type(version) is int and version > MAX_VERSION else repr(version)[:40]
        raise InvalidInput(f"{what}: the version must be an integer from 1 to {MAX_VERSION}, not {shown}")
    return version


def fields(comp_id: str, repository: str, tag: str, version: int, expires: int) -> dict:
    """What a statement says (in an OMS predicate as it is; slm's format adds its schema)."""
    return {"composition": comp_id, "repository": repository, "tag": tag, "version": check_version(version),
            "expires": format_time(expires)}


def sign(comp_id: str, repository: str, tag: str, version: int, expires: int, private_key) -> bytes:
    """A statement blob, signed with an Ed25519 private key."""
    from slm.distribution import signing

    return signing.sign_doc({"schema": SCHEMA, **fields(comp_id, repository, tag, version, expires)}, private_key)


def is_statement(data: bytes) -> bool:
    """Whether a signature blob claims to be a statement (slm's, or an OMS signature whose
    predicate carries one); not whether it is valid: parse_statement says that."""
    try:
        doc = parse_json_object(data, "signature", MAX_SIGNATURE_BYTES)
        return doc.get("schema") == SCHEMA or (doc.get("schema") == oms.STORE_SCHEMA
                                               and oms.claims_tag_statement(doc.get("bundle")))
    except InvalidInput:
        return False


def _statement_of(fields: dict, key: str, what: str) -> Statement:
    """The statement that `fields` (already signed under `key`) make, each field well formed."""
    if not isinstance(fields["composition"], str) or not dg.is_digest(fields["composition"]):
        raise InvalidInput(f"{what}: composition is not a digest")
    if not isinstance(fields["repository"], str) or not is_repository(fields["repository"]):
        raise InvalidInput(f"{what}: repository is not a repository name")
    if not isinstance(fields["tag"], str) or not is_tag(fields["tag"]):
        raise InvalidInput(f"{what}: tag is not a tag")
    version = check_version(fields["version"], what)
    expires = _parse_time(fields["expires"], what)
    return Statement(fields["composition"], fields["repository"], fields["tag"], version, expires, key)


def parse_statement(data: bytes, what: str = "statement") -> Statement:
    """A statement blob, checked: slm's (at most MAX_STATEMENT_BYTES) or a stored OMS signature
    whose predicate carries one (slm.distribution.oms.TAG_STATEMENT), exactly its fields, each
    well formed (InvalidInput), its signature valid under its own key (IntegrityError); whether
    that key is trusted, and whether the statement fits the tag and the clock, is check_statement's."""
    from slm.distribution import signing

    doc = parse_json_object(data, what, MAX_SIGNATURE_BYTES, strict_keys=True)
    if doc.get("schema") == oms.STORE_SCHEMA:
        if not isinstance(doc.get("composition"), str) or not dg.is_digest(doc["composition"]):
            raise InvalidInput(f"{what}: composition is not a digest")
        key, signed = oms.check_store_statement(doc, doc["composition"], what)
        fields = signed.tag_statement
        if fields is None:
            raise InvalidInput(f"{what}: an OMS signature that carries no statement for a tag")
        if set(fields) != OMS_FIELDS:
            raise InvalidInput(f"{what}: the predicate's {oms.TAG_STATEMENT} fields are not those of a statement")
        if fields["composition"] != doc["composition"]:
            raise IntegrityError(f"{what}: its statement names another composition than the bundle it signs")
        return _statement_of(fields, key, what)
    if doc.get("schema") != SCHEMA:
        raise InvalidInput(f"{what}: not an {SCHEMA} document (schema {str(doc.get('schema'))[:40]!r})")
    if len(data) > MAX_STATEMENT_BYTES:
        raise InvalidInput(f"{what}: larger than {MAX_STATEMENT_BYTES} bytes")
    if set(doc) != FIELDS:
        raise InvalidInput(f"{what}: fields are not those of {SCHEMA}")
    return _statement_of(doc, signing.verify_doc(doc, SCHEMA, what), what)


def check_statement(statement: bytes | Statement, *, repository: str, tag: str, now: float,
                    running: tuple[int, str] | None, trusted_keys, composition: str | None = None) -> Verdict:
    """Whether a device that follows `repository:tag` and runs `running` (version, composition
    id; None: nothing from this tag yet) may move to what `statement` names, at time `now`
    (seconds since the epoch). `composition`: the id the tag resolves to, when known (a
    statement of another composition attached to it is a mix-and-match).

    Checked in this order, so nothing the statement says is believed before its signature and
    its key are: well formed, signature, trusted key, repository/tag/composition, expiry (a
    statement expires at `expires` itself: now >= expires is expired; no allowance for clock
    skew, the device's clock is the one that decides), then the version against the running one."""
    from slm.distribution.signing import key_fingerprint  # signing reads statements: imported when used

    if not isinstance(statement, Statement):
        try:
            statement = parse_statement(statement)
        except IntegrityError as err:
            return Verdict(Reason.BAD_SIGNATURE, str(err))
        except InvalidInput as err:
            return Verdict(Reason.MALFORMED, str(err))
    s = statement
    if s.public_key not in set(trusted_keys):
        return Verdict(Reason.UNTRUSTED, f"statement signed by key {key_fingerprint(s.public_key)}, "
                       "which is not a trusted key", s)
    if (s.repository, s.tag) != (repository, tag):
        return Verdict(Reason.WRONG_TARGET, f"statement is for {s.repository}:{s.tag}, not {repository}:{tag}", s)
    if composition is not None and s.composition != composition:
        signed, wanted = dg.short_pair(s.composition, composition)
        return Verdict(Reason.WRONG_TARGET, f"statement is for composition {signed}, "
                       f"not {wanted} which {repository}:{tag} names", s)
    if now >= s.expires:
        return Verdict(Reason.EXPIRED, f"statement for {repository}:{tag} version {s.version} expired at "
                       f"{s.expires_text}: the registry may be withholding updates", s)
    if running is None:
        return Verdict(Reason.NEWER, f"version {s.version} of {repository}:{tag}", s)
    run_version, run_comp = running
    if s.version < run_version:
        return Verdict(Reason.ROLLBACK, f"statement for {repository}:{tag} is version {s.version}, older than "
                       f"version {run_version} running (a rollback)", s)
    if s.version == run_version and s.composition != run_comp:
        signed, running_id = dg.short_pair(s.composition, run_comp)
        return Verdict(Reason.EQUIVOCATION, f"statement gives version {s.version} of {repository}:{tag} to "
                       f"{signed}, but {running_id} runs as version {run_version} (equivocation)", s)
    if s.version == run_version:
        return Verdict(Reason.CURRENT, f"version {s.version} of {repository}:{tag} is running", s)
    return Verdict(Reason.NEWER, f"version {s.version} of {repository}:{tag}, above {run_version}", s)


# How far a refused statement got through check_statement's checks: of several refusals, the
# furthest is the one worth reporting (an expired statement for this tag says more than a
# statement for another tag beside it).
_STAGE = {Reason.MALFORMED: 0, Reason.BAD_SIGNATURE: 1, Reason.UNTRUSTED: 2, Reason.WRONG_TARGET: 3,
          Reason.EXPIRED: 4, Reason.ROLLBACK: 5, Reason.EQUIVOCATION: 5}


def check_statements(statements, *, repository: str, tag: str, now: float, running: tuple[int, str] | None,
                     trusted_keys, composition: str | None = None) -> Verdict:
    """check_statement over every statement a manifest carries (blobs or Statements): the
    accepted one of the highest version if any is accepted (statements for other tags beside
    it are not a mix-and-match: they are someone else's); else the refusal that got furthest
    through the checks (the higher version among equals); none at all is MISSING. Two trusted
    statements that give one version of the tag to two compositions refuse them all (EQUIVOCATION)."""
    trusted_keys = frozenset(trusted_keys)
    verdicts = [check_statement(s, repository=repository, tag=tag, now=now, running=running,
                                trusted_keys=trusted_keys, composition=composition) for s in statements]
    if not verdicts:
        return Verdict(Reason.MISSING, f"no signed statement for {repository}:{tag}")
    conflict = _equivocation(verdicts, repository, tag)
    if conflict is not None:
        return conflict
    accepted = [v for v in verdicts if v.accepted]
    if accepted:
        return max(accepted, key=lambda v: v.statement.version)
    return max(verdicts, key=lambda v: (_STAGE[v.reason], v.statement.version if v.statement else 0))


def _equivocation(verdicts: list[Verdict], repository: str, tag: str) -> Verdict | None:
    """Two statements of a trusted key that give one version of the tag to two compositions
    (whatever their expiry, whichever the tag resolves to): the key said two things, so no
    statement of it beside them is believed either."""
    said: dict[int, Statement] = {}
    for v in verdicts:
        s = v.statement
        if s is None or v.reason is Reason.UNTRUSTED or (s.repository, s.tag) != (repository, tag):
            continue  # not a trusted statement for this tag
        first = said.setdefault(s.version, s)
        if first.composition != s.composition:
            one, other = dg.short_pair(first.composition, s.composition)
            return Verdict(Reason.EQUIVOCATION, f"two statements give version {s.version} of {repository}:{tag} "
                           f"to {one} and to {other} (equivocation)", s)
    return None
