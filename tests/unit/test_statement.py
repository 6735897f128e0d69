"""Signed statements for a tag (slm.distribution.statement): every verdict of check_statement,
its boundaries, and hostile bytes. Pure: no store, no network, the clock given."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from slm.distribution import oms, signing, statement
from slm.distribution.bundle import canonical
from slm.distribution.statement import MAX_VERSION, Reason, check_statement, parse_statement
from slm.errors import (EquivocationRefused, ExitCode, Incompatible, IntegrityError, InvalidInput, RollbackRefused,
                        StatementExpired, WrongTarget)

KEY = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32)
OTHER = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([8]) * 32)
TRUSTED = (signing.public_key_text(KEY),)
C1, C2 = "blake3:" + "1" * 64, "blake3:" + "2" * 64
NOW = 1_800_000_000
REPO, TAG = "fleet/support", "prod"


def _blob(version=5, comp=C1, repo=REPO, tag=TAG, expires=NOW + 3600, key=KEY) -> bytes:
    return statement.sign(comp, repo, tag, version, expires, key)


def _check(blob, running=(5, C1), now=NOW, repo=REPO, tag=TAG, trusted=TRUSTED, composition=None):
    return check_statement(blob, repository=repo, tag=tag, now=now, running=running, trusted_keys=trusted,
                           composition=composition)


def _resigned(doc: dict, key=KEY) -> bytes:
    """`doc` (a statement's fields, changed) signed again: well signed, whatever it says."""
    body = {k: v for k, v in doc.items() if k not in ("algorithm", "public_key", "signature")}
    sig = key.sign(canonical(body))
    return canonical({**body, "algorithm": "ed25519", "public_key": signing.public_key_text(key),
                      "signature": base64.b64encode(sig).decode()})


def test_a_statement_round_trips_with_every_field_inside_what_is_signed():
    s = parse_statement(_blob())
    assert (s.composition, s.repository, s.tag, s.version) == (C1, REPO, TAG, 5)
    assert s.expires == NOW + 3600 and s.expires_text == "2027-01-15T09:00:00Z"
    doc = json.loads(_blob())
    for field, value in (("version", 6), ("tag", "dev"), ("repository", "fleet/other"),
                         ("expires", "2099-01-01T00:00:00Z"), ("composition", C2)):
        with pytest.raises(IntegrityError, match="does not verify"):
            parse_statement(canonical({**doc, field: value}))


@pytest.mark.parametrize("running, version, comp, reason", [
    (None, 1, C1, Reason.NEWER),  # nothing running yet
    ((5, C1), 6, C2, Reason.NEWER),
    ((5, C1), MAX_VERSION, C2, Reason.NEWER),
    ((5, C1), 5, C1, Reason.CURRENT),  # nothing to do
    ((5, C1), 4, C1, Reason.ROLLBACK),
    ((5, C1), 1, C2, Reason.ROLLBACK),
    ((5, C1), 5, C2, Reason.EQUIVOCATION),
    ((MAX_VERSION, C1), MAX_VERSION - 1, C2, Reason.ROLLBACK),
])
def test_the_version_against_the_one_running(running, version, comp, reason):
    v = _check(_blob(version, comp), running)
    assert v.reason is reason
    assert v.accepted == (reason in (Reason.NEWER, Reason.CURRENT))
    assert (v.error() is None) == v.accepted
    if v.accepted:
        assert v.raise_if_refused().version == version


@pytest.mark.parametrize("reason, error, code", [
    (Reason.ROLLBACK, RollbackRefused, 14), (Reason.EQUIVOCATION, EquivocationRefused, 15),
    (Reason.EXPIRED, StatementExpired, 16), (Reason.WRONG_TARGET, WrongTarget, 17),
    (Reason.UNTRUSTED, Incompatible, 6), (Reason.BAD_SIGNATURE, IntegrityError, 5), (Reason.MALFORMED, InvalidInput, 4),
])
def test_each_refusal_has_its_own_error_and_exit_code(reason, error, code):
    blobs = {
        Reason.ROLLBACK: (_blob(4), {}), Reason.EQUIVOCATION: (_blob(5, C2), {}),
        Reason.EXPIRED: (_blob(expires=NOW), {}), Reason.WRONG_TARGET: (_blob(tag="dev"), {}),
        Reason.UNTRUSTED: (_blob(key=OTHER), {}),
        Reason.BAD_SIGNATURE: (canonical({**json.loads(_blob()), "version": 9}), {}),
        Reason.MALFORMED: (b"{", {}),
    }
    blob, _ = blobs[reason]
    v = _check(blob)
    assert v.reason is reason and not v.accepted
    err = v.error()
    assert type(err) is error and err.code == code and "\n" not in str(err)
    with pytest.raises(error):
        v.raise_if_refused()
    codes = {r: e.code for r, e in statement._ERRORS.items() if r is not Reason.MISSING}  # MISSING is unsigned: 6
    assert len(set(codes.values())) == len(codes)


def test_expiry_is_exclusive_and_the_device_clock_decides():
    """Chosen: a statement expires at its `expires` second itself (now == expires is expired),
    with no allowance for clock skew either way: a device whose clock runs ahead sees
    statements expire early (it keeps what it runs, and says so), one whose clock lags is not
    given extra time by the check."""
    blob = _blob(expires=NOW)
    assert _check(blob, (4, C1), now=NOW - 1).reason is Reason.NEWER
    assert _check(blob, (4, C1), now=NOW - 0.001).accepted
    assert _check(blob, (4, C1), now=NOW).reason is Reason.EXPIRED
    assert _check(blob, (4, C1), now=NOW + 86400 * 365).reason is Reason.EXPIRED


def test_an_expired_statement_of_the_running_version_reports_the_freeze():
    assert _check(_blob(5, C1, expires=NOW - 1)).reason is Reason.EXPIRED


def test_mix_and_match_another_repository_tag_or_composition():
    assert _check(_blob(6, repo="fleet/other")).reason is Reason.WRONG_TARGET
    assert _check(_blob(6, tag="staging")).reason is Reason.WRONG_TARGET
    assert _check(_blob(6, C2), composition=C2).reason is Reason.NEWER
    v = _check(_blob(6, C2), composition=C1)
    assert v.reason is Reason.WRONG_TARGET and "composition" in v.message


def test_trust_and_signature_come_before_anything_the_statement_says():
    """An untrusted key's statement is refused as untrusted even when it also claims an older
    version, another tag and an expired time: nothing it says is believed first."""
    v = _check(_blob(1, C2, tag="dev", expires=NOW - 10, key=OTHER))
    assert v.reason is Reason.UNTRUSTED
    assert _check(_blob(), trusted=()).reason is Reason.UNTRUSTED
    assert _check(_blob(6), trusted=(signing.public_key_text(OTHER), *TRUSTED)).accepted


def test_a_statement_also_signs_its_composition_for_the_signing_policy():
    sig = signing.parse_signature(_blob(), C1)
    assert sig.public_key == TRUSTED[0]
    with pytest.raises(IntegrityError, match="signs composition"):
        signing.parse_signature(_blob(), C2)


@pytest.mark.parametrize("text, seconds", [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("366d", 366 * 86400)])
def test_durations(text, seconds):
    assert statement.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0d", "367d", "8785h", "1w", "30", "d", "-1d", "1.5d", "30 d", "٣d", "01d"])
def test_bad_durations_are_one_line_errors(text):
    with pytest.raises(InvalidInput, match="--expires") as err:
        statement.parse_duration(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("version", [0, -1, MAX_VERSION + 1, 10 ** 30, pytest.param(10 ** 5000, id="5001-digits"), True, 1.0, "3", None])
def test_bad_versions_are_refused_at_signing(version):
    with pytest.raises(InvalidInput, match="version"):
        _blob(version)


# ---- hostile bytes: each one line, each the malformed (4) or bad-signature (5) verdict ----

def _fields(**changes) -> bytes:
    return _resigned({**json.loads(_blob()), **changes})


@pytest.mark.hostile
@pytest.mark.parametrize("blob, reason", [
    (_blob()[:-7], Reason.MALFORMED),  # truncated
    (b"", Reason.MALFORMED),
    (b"[1,2]", Reason.MALFORMED),
    (b"\xff\xfe{}", Reason.MALFORMED),
    (b"[" * 100_000, Reason.MALFORMED),  # nested past the parser's recursion, and oversized
    (_blob()[:-1] + b',"pad":"' + b"x" * 5000 + b'"}', Reason.MALFORMED),  # oversized before it is parsed
    (_fields(version=0), Reason.MALFORMED),
    (_fields(version=MAX_VERSION + 1), Reason.MALFORMED),
    (_fields(version=True), Reason.MALFORMED),
    (_fields(version=6.0), Reason.MALFORMED),
    (_blob()[:-1] + b',"version":6}', Reason.MALFORMED),  # a key given twice, not the one signed
    (_blob().replace(b'"version":5', b'"version":' + b"9" * 5000), Reason.MALFORMED),
    (_fields(expires="2027-02-30T00:00:00Z"), Reason.MALFORMED),
    (_fields(expires="2027-01-01T00:00:00+01:00"), Reason.MALFORMED),
    (_fields(expires=1_900_000_000), Reason.MALFORMED),
    (_fields(tag="a" * 200), Reason.MALFORMED),
    (_fields(repository="Fleet/X"), Reason.MALFORMED),
    (_fields(composition="sha256:" + "0" * 64), Reason.MALFORMED),
    (_fields(schema="slm.statement/2"), Reason.MALFORMED),
    (_fields(extra=1), Reason.MALFORMED),
    (canonical({**json.loads(_blob()), "signature": "!!"}), Reason.MALFORMED),
    (canonical({**json.loads(_blob()), "signature": base64.b64encode(b"x" * 64).decode()}), Reason.BAD_SIGNATURE),
    (canonical({**json.loads(_blob()), "public_key": signing.public_key_text(OTHER)}), Reason.BAD_SIGNATURE),
])
def test_hostile_statements_are_refused_in_one_line(blob, reason):
    v = _check(blob)
    assert v.reason is reason, v.message
    assert v.statement is None and "\n" not in v.message and len(v.message) < 400


@pytest.mark.hostile
def test_a_plain_signature_is_not_a_statement_and_a_statement_not_a_plain_signature():
    plain = signing.sign(C1, KEY)
    v = _check(plain)
    assert v.reason is Reason.MALFORMED and "slm.statement/1" in v.message
    assert not statement.is_statement(plain) and statement.is_statement(_blob())
    # the statement's schema is its own: a verifier that knows only slm.signature/1 refuses it
    doc = json.loads(_blob())
    with pytest.raises(InvalidInput, match="not an slm.signature/1"):
        signing.verify_doc(doc, signing.SCHEMA, "statement")
    # a statement's fields relabelled as a plain signature do not verify: the schema is signed
    as_plain = canonical({k: doc[k] for k in ("composition", "algorithm", "public_key", "signature")}
                         | {"schema": signing.SCHEMA})
    with pytest.raises(IntegrityError, match="does not verify"):
        signing.parse_signature(as_plain, C1)


@pytest.mark.hostile
def test_an_ecdsa_key_in_a_statement_is_a_one_line_refusal():
    forged = canonical({**json.loads(_blob()), "public_key": oms.public_key_text(ec.generate_private_key(ec.SECP256R1()))})
    v = _check(forged)
    assert v.reason is Reason.MALFORMED and "public_key is not an ed25519" in v.message
    assert v.error().code == ExitCode.INVALID_INPUT


def _many(blobs, running=(5, C1), now=NOW):
    return statement.check_statements(blobs, repository=REPO, tag=TAG, now=now, running=running, trusted_keys=TRUSTED)


def test_of_several_statements_the_highest_accepted_version_wins():
    v = _many([_blob(6, C2), _blob(9, C2), _blob(12, C2, tag="dev"), _blob(13, C2, key=OTHER), b"junk"])
    assert v.reason is Reason.NEWER and v.statement.version == 9
    assert _many([_blob(4), _blob(5)]).reason is Reason.CURRENT  # an older one beside is not a rollback


@pytest.mark.parametrize("blobs, reason, version", [
    ([], Reason.MISSING, None),
    ([b"junk", _blob(7, tag="dev")], Reason.WRONG_TARGET, 7),
    ([_blob(7, tag="dev"), _blob(8, expires=NOW)], Reason.EXPIRED, 8),  # the furthest refusal is reported
    ([_blob(3), _blob(4), _blob(9, key=OTHER)], Reason.ROLLBACK, 4),
    ([_blob(4), _blob(5, C2)], Reason.EQUIVOCATION, 5),
])
def test_of_several_refused_statements_the_furthest_refusal_is_reported(blobs, reason, version):
    v = _many(blobs)
    assert v.reason is reason and not v.accepted
    assert (v.statement.version if v.statement else None) == version
    assert v.error().code == {Reason.MISSING: 6, Reason.WRONG_TARGET: 17, Reason.EXPIRED: 16,
                              Reason.ROLLBACK: 14, Reason.EQUIVOCATION: 15}[reason]


@pytest.mark.hostile
@pytest.mark.parametrize("running", [None, (5, C1)])
def test_two_trusted_statements_giving_one_version_to_two_compositions_are_an_equivocation(running):
    """The signer (or whoever holds its key) said version 6 is C1 and also C2: whichever one the
    device would pick, the other device was told otherwise; neither is followed."""
    for blobs in ([_blob(6, C1), _blob(6, C2)], [_blob(6, C2), _blob(6, C1)],
                  [_blob(7, C2), _blob(6, C1), _blob(6, C2, expires=NOW)]):
        v = _many(blobs, running=running)
        assert v.reason is Reason.EQUIVOCATION and v.error().code == 15
    assert _many([_blob(6, C1), _blob(6, C2, tag="dev"), _blob(6, C2, key=OTHER)], running=running).accepted


@pytest.mark.hostile
@pytest.mark.parametrize("expires", ["0000-01-01T00:00:00Z", "2027-00-10T00:00:00Z", "2027-13-01T00:00:00Z"])
def test_an_expiry_outside_the_calendar_is_malformed_not_a_crash(expires):
    """Signed under any key (the signature is checked before the key is trusted), so a registry
    can serve it: a year 0 or a month 0 or 13 is a one-line malformed verdict."""
    blob = _resigned({**json.loads(_blob()), "expires": expires}, key=OTHER)
    v = _check(blob)
    assert v.reason is Reason.MALFORMED and "not a real time" in v.message
    with pytest.raises(InvalidInput, match="not a real time"):
        parse_statement(blob)
