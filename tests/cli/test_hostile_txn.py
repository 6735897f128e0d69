"""The one store transaction (slm/store/transaction.py) that activation, import, receive, signing
and gc open instead of each writing the journal protocol by hand: an intent before anything,
undo (newest step first) before the commit point, CommittedIncomplete (exit 13) after it,
a commit whose effect landed despite its error counted as committed. The operations' own
crash and I/O-error matrices (test_crash.py, test_durability.py) run through it too; these
tests pin the object's contract on a real store, failure by failure."""

from __future__ import annotations

import pytest

from helpers import snapshot
from slm.errors import CommittedIncomplete, ExitCode, InvalidInput, IOFailure
from slm.store import digest as dg
from slm.store import fs

pytestmark = pytest.mark.hostile

NEW = dg.of_bytes(b"the new state")
OLD = dg.of_bytes(b"the old state")


def _pending(store) -> list[tuple[str, str, str | None, str]]:
    return [(i.name, i.op, i.old, i.new) for i in store.journal.pending()]


def _fail_when(monkeypatch, op: str, detail_ends: str) -> None:
    """The fs layer's next `op` on a path ending with `detail_ends` fails with EIO."""
    def hook(kind: str, detail: str) -> None:
        if kind == op and detail.endswith(detail_ends):
            raise IOFailure(f"cannot {kind} {detail}: Input/output error (injected)")
    monkeypatch.setattr(fs, "fault_hook", hook)


def test_a_failure_before_the_commit_point_is_undone_newest_step_first(store):
    store.names.set("adapters", "kept", OLD)  # names/adapters/ exists before, as it stays after
    before = snapshot(store.root)
    undone = []
    with pytest.raises(InvalidInput, match=r"^a bad input$"):
        with store.transaction("active", "activate", NEW, old=OLD, done="x is committed") as tx:
            assert _pending(store) == [("active", "activate", OLD, NEW)]  # the intent comes first
            tx.on_undo(lambda: undone.append("first registered"))
            store.names.set("adapters", "half-done", NEW)
            tx.on_undo(lambda: (undone.append("last registered"), store.names.remove("adapters", "half-done")))
            raise InvalidInput("a bad input")
    assert undone == ["last registered", "first registered"]
    assert _pending(store) == []
    assert snapshot(store.root) == before, "an undone transaction leaves the store as it was"


def test_an_interrupt_before_the_commit_point_is_undone_and_stays_an_interrupt(store):
    undone = []
    with pytest.raises(KeyboardInterrupt):
        with store.transaction("active", "activate", NEW) as tx:
            tx.on_undo(lambda: undone.append("undo"))
            raise KeyboardInterrupt
    assert undone == ["undo"] and _pending(store) == []


def test_a_failure_after_the_commit_point_is_committed_incomplete_and_keeps_the_intent(store):
    undone = []
    with pytest.raises(CommittedIncomplete) as e:
        with store.transaction("active", "activate", NEW, done="the transition to x is committed") as tx:
            tx.on_undo(lambda: undone.append("undo"))
            tx.commit(lambda: store.names.set("adapters", "made", NEW))
            raise IOFailure("cannot write refs/active: No space left on device")
    assert e.value.code == ExitCode.INCOMPLETE == 13
    assert str(e.value) == ("the transition to x is committed, but finishing it failed (cannot write "
                            "refs/active: No space left on device); run `slm fsck --repair` to complete it")
    assert undone == [], "a committed change is never taken back"
    assert store.names.get("adapters", "made") == NEW
    assert _pending(store) == [("active", "activate", None, NEW)], "fsck --repair finishes from the intent"


def test_an_interrupt_after_the_commit_point_says_committed_not_interrupted(store):
    with pytest.raises(CommittedIncomplete, match=r"is committed, but finishing it failed \(interrupted\)"):
        with store.transaction("active", "activate", NEW) as tx:
            tx.commit()
            raise KeyboardInterrupt
    assert len(_pending(store)) == 1


def test_a_commit_whose_effect_landed_despite_its_error_is_committed(store):
    """A rename done, its directory's fsync failed: the name is there, so the change is made."""
    undone = []

    def set_then_fail():
        store.names.set("adapters", "landed", NEW)
        raise IOFailure("cannot fsync names/adapters: Input/output error")
    with pytest.raises(CommittedIncomplete, match=r"^x is imported, but finishing it failed \(cannot fsync"):
        with store.transaction("import-adapter-landed", "import", NEW, created=True, done="x is imported") as tx:
            tx.on_undo(lambda: undone.append("undo"))
            tx.commit(set_then_fail, landed=lambda: store.names.get("adapters", "landed") == NEW)
    assert undone == []
    assert [p[0] for p in _pending(store)] == ["import-adapter-landed"]


def test_a_commit_that_did_not_land_is_undone_with_its_own_error(store):
    before = snapshot(store.root)

    def fail():
        raise IOFailure("cannot rename names/adapters/x: Input/output error")
    with pytest.raises(IOFailure, match=r"^cannot rename names/adapters/x: Input/output error$"):
        with store.transaction("import-adapter-x", "import", NEW, created=True) as tx:
            tx.commit(fail, landed=lambda: store.names.get("adapters", "x") == NEW)
    assert _pending(store) == [] and snapshot(store.root) == before


def test_clearing_the_intent_failing_after_a_commit_is_committed_incomplete(store, monkeypatch):
    _fail_when(monkeypatch, "unlink", "active.intent")
    with pytest.raises(CommittedIncomplete, match=r"^x is committed, but finishing it failed \(cannot unlink"):
        with store.transaction("active", "activate", NEW, done="x is committed") as tx:
            tx.commit()
    monkeypatch.setattr(fs, "fault_hook", None)
    assert len(_pending(store)) == 1


def test_an_undo_that_fails_keeps_the_intent_and_says_run_fsck_repair(store):
    def refuse():
        raise IOFailure("cannot unlink objects/blake3/ab: Input/output error")
    with pytest.raises(InvalidInput) as e:
        with store.transaction("active", "activate", NEW) as tx:
            tx.on_undo(refuse)
            raise InvalidInput("a bad input")
    assert str(e.value) == ("a bad input; undoing it failed too (cannot unlink objects/blake3/ab: "
                            "Input/output error): run `slm fsck --repair`")
    assert len(_pending(store)) == 1, "fsck --repair takes the same decision from the intent"


def test_an_unjournaled_transaction_writes_no_intent_but_still_undoes(store):
    seen, undone = [], []
    with pytest.raises(InvalidInput):
        with store.transaction("sign", "sign", NEW, journaled=False) as tx:
            seen.append(_pending(store))
            tx.on_undo(lambda: undone.append("undo"))
            raise InvalidInput("a bad signature")
    assert seen == [[]] and undone == ["undo"]


def test_a_transaction_without_undo_leaves_its_intent_and_its_error(store):
    """gc: every removal is final on its own; fsck --repair clears the intent, gc finishes."""
    with pytest.raises(IOFailure, match=r"^cannot unlink objects/blake3/cd: Input/output error$"):
        with store.transaction("gc", "gc", NEW, undoable=False) as tx:
            raise IOFailure("cannot unlink objects/blake3/cd: Input/output error")
    assert _pending(store) == [("gc", "gc", None, NEW)]
    with store.transaction("gc-again", "gc", NEW, undoable=False) as tx:
        with pytest.raises(TypeError, match="no commit point"):
            tx.commit()
    assert [p[0] for p in _pending(store)] == ["gc"], "a transaction that went through clears its own intent"
