"""The prompt cache on disk is not trusted for being there: an entry rewritten by other means
than slm (with NumPy, its logits raised towards another answer, every field kept, its recorded
digest too) used to answer `slm run` as a cache hit, with `slm verify` and `slm fsck` saying
clean. Now such an entry is a miss and a warning, `verify` fails on it (exit 5), `fsck` reports
it (exit 5) and `fsck --repair` removes it."""

from __future__ import annotations

import io

import numpy as np
import pytest

from helpers import copy_store, one_line, tiny_store

pytestmark = pytest.mark.hostile

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("prompt-cache"), tiny_model)


def _run(cli, store):
    r = cli("--store", store, "run", PROMPT, "--max-tokens", "6", "--temperature", "0", "--json")
    assert r.code == 0, r.err
    return r


def _entries(store):
    return sorted((store / "cache" / "prefix").glob("*/*.npz"))


def _raise_a_token(path, token: int) -> None:
    """Rewrite an entry as NumPy would: every field read and written back, its logits changed."""
    with np.load(path, allow_pickle=False) as entry:
        fields = {name: entry[name] for name in entry.files}
    fields["logits"] = fields["logits"].copy()
    fields["logits"][token] = fields["logits"].max() + 100.0
    buf = io.BytesIO()
    np.savez(buf, **fields)
    path.write_bytes(buf.getvalue())


def test_a_rewritten_entry_is_a_miss_and_a_warning_and_verify_and_fsck_report_it(cli, template, tmp_path):
    store = copy_store(template, tmp_path)
    honest = _run(cli, store).json()
    assert honest["prefix_cache"] == "miss"
    assert _run(cli, store).json()["prefix_cache"] == "hit"
    (entry,) = _entries(store)
    forced = next(t for t in range(3, 100) if t != honest["tokens"][0])
    _raise_a_token(entry, forced)

    r = _run(cli, store)
    answer = r.json()
    assert answer["prefix_cache"] == "damaged" and answer["tokens"] == honest["tokens"]
    assert one_line(r.err) and "warning" in r.err and "digest" in r.err
    assert _run(cli, store).json()["prefix_cache"] == "hit", "the run's own entry replaced the altered one"

    _raise_a_token(entry, forced)
    verify = cli("--store", store, "verify", "--json")
    assert verify.code == 5, (verify.out, verify.err)
    integrity = verify.json()["integrity"]
    assert integrity["bad_cache_entries"] == [str(entry.relative_to(store))] and integrity["cache_entries"] == 1
    found = cli("--store", store, "fsck", "--json")
    assert found.code == 5
    (finding,) = found.json()["findings"]
    assert finding["problem"] == "damaged-cache-entry" and str(entry.relative_to(store)) in finding["what"]
    assert cli("--store", store, "fsck", "--repair").code == 0
    assert not entry.exists() and cli("--store", store, "fsck").code == 0
    assert cli("--store", store, "verify").code == 0


def _damage(entry, damage: str) -> None:
    if damage == "truncated":
        data = entry.read_bytes()
        entry.write_bytes(data[: len(data) // 2])
        return
    with np.load(entry, allow_pickle=False) as loaded:
        fields = {name: loaded[name] for name in loaded.files if not (damage == "digest dropped" and name == "digest")}
    buf = io.BytesIO()
    (np.savez if damage == "digest dropped" else np.savez_compressed)(buf, **fields)
    entry.write_bytes(buf.getvalue())


@pytest.mark.parametrize("damage", ["truncated", "digest dropped", "compressed"])
def test_an_entry_that_is_not_whole_is_a_miss_and_a_finding(cli, template, tmp_path, damage):
    store = copy_store(template, tmp_path)
    honest = _run(cli, store).json()
    (entry,) = _entries(store)
    _damage(entry, damage)
    answer = _run(cli, store).json()
    assert answer["prefix_cache"] == "damaged" and answer["tokens"] == honest["tokens"]
    _damage(entry, damage)  # (the run wrote its own entry in its place)
    found = cli("--store", store, "fsck", "--json")
    assert found.code == 5 and found.json()["findings"][0]["problem"] == "damaged-cache-entry"


def test_a_chat_turn_on_a_rewritten_entry_is_a_miss_and_says_so(template, tmp_path, capsys):
    """`slm chat` reads the same cache: its answer comes from the prompt computed again, and its
    printer says on stderr that the entry was not used."""
    import slm
    from slm.conversation import _run, parse
    from slm.render import ChatPrinter

    store = copy_store(template, tmp_path)
    honest = slm.Conversation(slm.Runtime(slm.Store.open(store)), "tq", max_tokens=6).ask(PROMPT)
    (entry,) = _entries(store)
    _raise_a_token(entry, next(t for t in range(3, 100) if t != honest.tokens[0]))
    conv = slm.Conversation(slm.Runtime(slm.Store.open(store)), "tq", max_tokens=6)
    capsys.readouterr()
    _run(conv, parse(PROMPT), ChatPrinter())
    out, err = capsys.readouterr()
    (answer,) = [m.content for m in conv.history if m.role == "assistant"]
    assert answer == honest.text and out
    assert one_line(err) and "warning" in err and "digest" in err
