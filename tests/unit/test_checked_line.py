"""The one checksummed-line codec (slm/store/checked_line.py) under refs/active, the journal's
intents and every reflog: a line decodes only whole and unchanged, and the lines slm wrote
before the codec existed still decode to what they said."""

from __future__ import annotations

import pytest

from slm.errors import IntegrityError
from slm.store import checked_line, journal, reflog, refs
from slm.store import digest as dg

OLD = dg.of_bytes(b"old")
NEW = dg.of_bytes(b"new")
BODIES = [OLD, f"activate {OLD} {NEW} created", f"3 {OLD} - 1765000000.500000 rm", "x"]

# Lines as the three hand-written encoders wrote them (refs.py, journal.py, reflog.py before
# they shared the codec), copied from their output: a store they wrote must read the same.
WRITTEN_BEFORE = {
    "ref": b"blake3:96a4257289f9ebcbc94bfc49276f89ed87f8c951e3fa832d44dceb9b220520a5 9915db349a8f8d5d\n",
    "intent": b"activate blake3:96a4257289f9ebcbc94bfc49276f89ed87f8c951e3fa832d44dceb9b220520a5 "
              b"blake3:b20ab0a020a48d349e0c64d109c441f87c9bc43d49fc701c4a5f6f1b16aa4e32 created 4b3a70a195efddd1\n",
    "intent-without-flags": b"import - blake3:b20ab0a020a48d349e0c64d109c441f87c9bc43d49fc701c4a5f6f1b16aa4e32 "
                            b"87a411dbf1663ce0\n",
    "reflog": b"3 blake3:96a4257289f9ebcbc94bfc49276f89ed87f8c951e3fa832d44dceb9b220520a5 "
              b"blake3:b20ab0a020a48d349e0c64d109c441f87c9bc43d49fc701c4a5f6f1b16aa4e32 1765000000.250000 "
              b"rollback df2e8cb8f4d9d6d7\n",
    "name-log-removal": b"1 blake3:96a4257289f9ebcbc94bfc49276f89ed87f8c951e3fa832d44dceb9b220520a5 - "
                        b"1765000000.500000 rm c0670f2fb15080ff\n",
}


@pytest.mark.parametrize("body", BODIES)
def test_a_line_round_trips(body):
    line = checked_line.encode(body)
    assert line.startswith(body.encode("ascii") + b" ") and line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert checked_line.decode(line) == body


@pytest.mark.parametrize("body", BODIES)
def test_any_flipped_bit_is_caught(body):
    line = checked_line.encode(body)
    for i in range(len(line)):
        for bit in range(8):
            damaged = bytearray(line)
            damaged[i] ^= 1 << bit
            assert checked_line.decode(bytes(damaged)) is None, (i, bit)


@pytest.mark.parametrize("body", BODIES)
def test_a_torn_line_is_not_intact(body):
    line = checked_line.encode(body)
    for end in range(len(line)):
        assert checked_line.decode(line[:end]) is None, end
    assert checked_line.decode(line + b"more") is None, "bytes after the newline"
    assert checked_line.decode(line + line) is None, "two lines are not one"


def test_a_line_without_a_checksum_is_not_intact():
    assert checked_line.decode(f"{OLD}\n".encode()) is None
    assert checked_line.decode(f"{OLD} \n".encode()) is None
    assert checked_line.decode(b"\n") is None
    check = checked_line.check_of(OLD)
    assert checked_line.decode(f"{check}\n".encode()) is None, "a check alone checks nothing"
    assert checked_line.decode(f"{OLD} {check.upper()}\n".encode()) is None


def test_a_body_is_one_ascii_line():
    with pytest.raises(ValueError, match="one line"):
        checked_line.encode("two\nlines")
    with pytest.raises(UnicodeEncodeError):
        checked_line.encode("caf\u00e9")
    assert checked_line.decode("caf\u00e9 0123456789abcdef\n".encode("utf-8")) is None


def test_lines_written_before_the_codec_decode_and_are_written_the_same():
    assert refs.decode_ref(WRITTEN_BEFORE["ref"], "refs/active") == OLD
    assert refs.encode_ref(OLD) == WRITTEN_BEFORE["ref"]
    intent = journal.parse_intent("active", WRITTEN_BEFORE["intent"])
    assert intent == journal.Intent("active", "activate", OLD, NEW, created=True)
    assert checked_line.encode(f"activate {OLD} {NEW} created") == WRITTEN_BEFORE["intent"]
    assert journal.parse_intent("import-base-x", WRITTEN_BEFORE["intent-without-flags"]) == \
        journal.Intent("import-base-x", "import", None, NEW, created=False)
    entry = reflog.parse_line(WRITTEN_BEFORE["reflog"])
    assert entry == reflog.Entry(3, OLD, NEW, 1765000000.25, "rollback")
    assert reflog.encode(entry) == WRITTEN_BEFORE["reflog"]
    removal = reflog.parse_line(WRITTEN_BEFORE["name-log-removal"], deletions=True)
    assert removal == reflog.Entry(1, OLD, None, 1765000000.5, "rm")
    assert reflog.encode(removal) == WRITTEN_BEFORE["name-log-removal"]
    assert reflog.parse_line(WRITTEN_BEFORE["name-log-removal"]) is None, "a removal only in a name's log"


def test_each_reader_refuses_a_damaged_line_in_its_own_words():
    flipped = bytearray(WRITTEN_BEFORE["ref"])
    flipped[10] ^= 1
    with pytest.raises(IntegrityError, match=r"^refs/active is damaged \(run `slm fsck`\)$"):
        refs.decode_ref(bytes(flipped), "refs/active")
    with pytest.raises(IntegrityError, match=r"^journal/active.intent is damaged"):
        journal.parse_intent("active", WRITTEN_BEFORE["intent"][:-1])
    with pytest.raises(IntegrityError, match=r"^journal/active.intent is damaged \(a bad field\)$"):
        journal.parse_intent("active", checked_line.encode(f"activate {OLD} not-a-digest -"))
    assert reflog.parse_line(checked_line.encode(f"3 {OLD} {NEW} 1.0")) is None, "a field short"

