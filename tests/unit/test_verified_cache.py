"""The verified-digest cache (slm/store/verified.py, docs/recovery.md): an activation does not
re-read a blob that was re-hashed and has not changed since; a blob changed in place is still
caught; `slm verify` and `slm fsck` re-hash everything whatever the cache says; a damaged cache
is ignored, never an error."""

from __future__ import annotations

import os
import stat

import pytest

import slm
from helpers import wait_until
from slm.compose.adapter_manifest import parse_adapter_manifest
from slm.compose.base_manifest import parse_base_manifest
from slm.store import digest as dg
from slm.store import objects as objects_module
from slm.store import verified


def _file_clock_past(ns: int, probe_dir) -> None:
    """Wait until a file changed now gets a ctime later than `ns`. The kernel stamps file times
    from a coarse clock: what is waited for is that state, seen on a probe file outside the
    store, not a duration guessed from the clock's tick (docs/testing.md, "Under load")."""
    probe = probe_dir / ".clock-probe"

    def passed() -> bool:
        probe.touch()  # sets the times to now: the ctime is the kernel's clock as files see it
        return probe.stat().st_ctime_ns > ns

    wait_until(passed, f"a file time past {ns}")


def _settle(store_dir) -> None:
    """A blob is recorded only once its ctime is verified.RACY_NS old (the racily-clean guard):
    wait until every file of the store is that old."""
    newest = max(p.lstat().st_ctime_ns for p in store_dir.rglob("*"))
    _file_clock_past(newest + verified.RACY_NS, store_dir.parent)


@pytest.fixture
def tiny(cli, store, store_dir, tiny_model, tmp_path):
    import make_random_lora

    lora = make_random_lora.make_random_lora(tmp_path / "lora", rank=4, seed=1, hidden=64, intermediate=128,
                                             layers=2, kv_dim=32)
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("import", "adapter", lora, "--name", "a1").code == 0
    _settle(store_dir)
    return store_dir


class Hashed:
    """Every blob digest the store's code hashes bytes for, counted through the hasher."""

    def __init__(self, monkeypatch):
        self.digests: list[str] = []
        real_of_bytes, real_hasher = dg.of_bytes, dg.hasher
        outer = self

        def of_bytes(data):
            found = real_of_bytes(data)
            outer.digests.append(found)
            return found

        class Counting:
            def __init__(self):
                self.inner = real_hasher()

            def update(self, chunk):
                self.inner.update(chunk)

            def hexdigest(self):
                found = self.inner.hexdigest()
                outer.digests.append(dg.PREFIX + found)
                return found

        monkeypatch.setattr(dg, "of_bytes", of_bytes)
        monkeypatch.setattr(dg, "hasher", Counting)


def _blobs(store_dir, base="tq", adapter="a1") -> tuple[set[str], set[str]]:
    """(the base's tensor and tokenizer blobs, the adapter's tensor blobs)."""
    s = slm.Store.open(store_dir)._s
    base_blobs = set(parse_base_manifest(s.objects.read_verified(s.names.get("bases", base))).blob_digests())
    adapter_blobs = set(parse_adapter_manifest(s.objects.read_verified(s.names.get("adapters", adapter)))
                        .blob_digests())
    return base_blobs, adapter_blobs


def _blob_path(store_dir, digest: str):
    return store_dir / "objects" / "blake3" / dg.hex_of(digest)


def _largest(store_dir, digests: set[str]) -> str:
    return max(sorted(digests), key=lambda d: _blob_path(store_dir, d).stat().st_size)


def _change_in_place(path, probe_dir) -> None:
    """Same size, other bytes, mtime put back: only the ctime (which the kernel sets) moves."""
    before = path.stat()
    _file_clock_past(before.st_ctime_ns, probe_dir)  # so the change below moves the ctime
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)
    os.chmod(path, 0o444)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns


def test_an_activation_does_not_re_read_an_unchanged_blob(tiny, monkeypatch):
    base_blobs, adapter_blobs = _blobs(tiny)
    slm.Store.open(tiny).activate("tq", ["a1"])  # re-hashes everything, records it
    assert (tiny / "cache" / verified.FILE_NAME).is_file()
    hashed = Hashed(monkeypatch)
    slm.Store.open(tiny).activate("tq")  # a new Store: the cache comes from its file, as in a new process
    slm.Store.open(tiny).activate("tq", ["a1"])
    assert not (base_blobs | adapter_blobs) & set(hashed.digests), "an unchanged blob was re-hashed"


def test_the_first_activation_without_a_cache_re_hashes_every_blob(tiny, monkeypatch):
    base_blobs, adapter_blobs = _blobs(tiny)
    (tiny / "cache" / verified.FILE_NAME).unlink()  # (the imports recorded what they wrote)
    hashed = Hashed(monkeypatch)
    slm.Store.open(tiny).activate("tq", ["a1"])
    assert base_blobs | adapter_blobs <= set(hashed.digests)


def test_a_record_no_key_spells_vouches_for_nothing(tiny, monkeypatch):
    """Records are kept as the file spells them and compared with keys spelt by the cache
    itself: a record spelt otherwise (even one naming the same numbers) or a line that is no
    record, in a file with a valid checksum, makes the activation re-hash, never trusts."""
    base_blobs, adapter_blobs = _blobs(tiny)
    slm.Store.open(tiny).activate("tq", ["a1"])
    cache = tiny / "cache" / verified.FILE_NAME
    records = verified._parse(cache.read_bytes())
    assert {dg.hex_of(d) for d in base_blobs | adapter_blobs} <= set(records)
    base_victim, adapter_victim = sorted(base_blobs)[0], sorted(adapter_blobs)[0]
    key = verified.key_of(_blob_path(tiny, base_victim).stat())
    assert records[dg.hex_of(base_victim)] == verified.spell(key)
    records[dg.hex_of(base_victim)] = "0" + verified.spell(key)  # the same numbers, spelt otherwise
    records[dg.hex_of(adapter_victim)] = "vouched"
    records["not-a-digest"] = "1 2 3 4 5"
    cache.write_bytes(verified._serialize(records))
    hashed = Hashed(monkeypatch)
    slm.Store.open(tiny).activate("tq")
    slm.Store.open(tiny).activate("tq", ["a1"])
    assert {base_victim, adapter_victim} <= set(hashed.digests)
    assert not (base_blobs | adapter_blobs) - {base_victim, adapter_victim} & set(hashed.digests)
    nospace_body = verified.HEADER + b"no-space-in-this-line\n"
    cache.write_bytes(nospace_body + dg.of_bytes(nospace_body).encode() + b"\n")
    assert verified._parse(cache.read_bytes()) == {}


@pytest.mark.parametrize("which", ["base", "adapter"])
def test_a_blob_changed_in_place_is_caught_by_activate_and_verify(cli, tiny, which):
    base_blobs, adapter_blobs = _blobs(tiny)
    r = cli("activate", "tq", "a1", "--json")  # every blob recorded in the cache
    assert r.code == 0
    comp_id = r.json()["active"]["id"]
    assert cli("activate", "tq").code == 0
    victim = _largest(tiny, base_blobs if which == "base" else adapter_blobs)
    _change_in_place(_blob_path(tiny, victim), tiny.parent)
    r = cli("activate", "tq", "a1")
    assert r.code == 5 and "corrupt" in r.err, r.err
    r = cli("verify", comp_id, "--json", "--no-numerics")
    assert r.code == 5
    assert victim in r.json()["integrity"]["bad_blobs"]


def test_verify_and_fsck_re_hash_what_the_cache_vouches_for(cli, tiny):
    """Bytes that change with no write (bit rot) keep their file's key: the cache cannot tell
    (docs/recovery.md), so activate trusts it; verify and fsck re-hash and find it, and verify
    withdraws the cache's word, so the next activation re-hashes it and refuses."""
    base_blobs, _ = _blobs(tiny)
    assert cli("activate", "tq", "a1").code == 0
    victim = _largest(tiny, base_blobs)
    path = _blob_path(tiny, victim)
    _change_in_place(path, tiny.parent)
    cache = tiny / "cache" / verified.FILE_NAME
    records = verified._parse(cache.read_bytes())
    records[dg.hex_of(victim)] = verified.spell(verified.key_of(path.stat()))  # as if the bytes had rotted in place
    cache.write_bytes(verified._serialize(records))
    assert cli("activate", "tq").code == 0  # trusted: what the cache is documented not to catch
    r = cli("verify", "--json", "--no-numerics")
    assert r.code == 5 and r.json()["integrity"]["bad_blobs"] == [victim]
    r = cli("activate", "tq", "a1")
    assert r.code == 5 and "corrupt" in r.err, r.err
    cache.write_bytes(verified._serialize(records))  # vouch for it again: fsck does not listen either
    r = cli("fsck", "--json")
    assert r.code == 5
    assert any(f["problem"] == "corrupt-blob" and dg.short(victim) in f["what"] for f in r.json()["findings"])


@pytest.mark.parametrize("damage", ["garbage", "torn", "edited", "empty", "directory", "fifo", "symlink"])
def test_a_damaged_cache_is_ignored(cli, tiny, monkeypatch, damage):
    base_blobs, _ = _blobs(tiny)
    assert cli("activate", "tq", "a1").code == 0
    cache = tiny / "cache" / verified.FILE_NAME
    good = cache.read_bytes()
    cache.unlink()
    if damage == "garbage":
        cache.write_bytes(b"\x00\xffnot a cache\n" * 50)
    elif damage == "torn":
        cache.write_bytes(good[: len(good) // 2])
    elif damage == "edited":  # one record's inode changed: the checksum no longer matches
        lines = good.split(b"\n")
        fields = lines[1].split(b" ")
        fields[2] = str(int(fields[2]) + 1).encode()
        lines[1] = b" ".join(fields)
        cache.write_bytes(b"\n".join(lines))
    elif damage == "empty":
        cache.write_bytes(b"")
    elif damage == "directory":
        cache.mkdir()
    elif damage == "fifo":
        os.mkfifo(cache)
    else:
        cache.symlink_to(tiny / "config.toml")
    hashed = Hashed(monkeypatch)
    r = cli("activate", "tq")
    assert r.code == 0, r.err
    assert base_blobs <= set(hashed.digests), "a damaged cache was trusted"
    if damage in ("garbage", "torn", "edited", "empty"):  # rewritten whole on the next save
        assert verified._parse(cache.read_bytes())
    elif damage == "fifo":
        assert stat.S_ISFIFO(os.lstat(cache).st_mode)
    elif damage == "symlink":
        assert cache.is_symlink() and (tiny / "config.toml").read_bytes().startswith(b"format")


def test_a_hard_link_in_place_of_the_cache_is_left_alone(cli, tiny):
    """The cache is rewritten in place: a link to a blob there must not cut the blob."""
    base_blobs, _ = _blobs(tiny)
    victim = _largest(tiny, base_blobs)
    cache = tiny / "cache" / verified.FILE_NAME
    cache.unlink(missing_ok=True)
    os.link(_blob_path(tiny, victim), cache)
    assert cli("activate", "tq").code == 0
    assert dg.of_bytes(_blob_path(tiny, victim).read_bytes()) == victim


def test_fsck_keeps_exactly_the_blobs_it_verified(cli, tiny):
    assert cli("activate", "tq", "a1").code == 0
    _settle(tiny)  # the composition record it just stored is old enough to be recorded
    s = slm.Store.open(tiny)._s
    stored = {d for d in s.objects.digests()}
    cache = tiny / "cache" / verified.FILE_NAME
    records = verified._parse(cache.read_bytes())
    records["0" * 64] = verified.spell((1, 2, 3, 4, 5))  # a blob gc removed long ago
    cache.write_bytes(verified._serialize(records))
    assert cli("fsck").code == 0
    assert {dg.PREFIX + h for h in verified._parse(cache.read_bytes())} == stored


def test_a_blob_changed_while_it_is_hashed_is_not_recorded(tiny, monkeypatch):
    """The key is taken before and after the hash: a file that changed meanwhile is not vouched for."""
    base_blobs, _ = _blobs(tiny)
    victim = _largest(tiny, base_blobs)
    s = slm.Store.open(tiny)._s
    real_fstat = os.fstat
    calls = []

    def fstat_then_touch(fd):
        result = real_fstat(fd)
        calls.append(fd)
        if len(calls) == 1:  # between the "before" and the "after" look at the file
            _file_clock_past(result.st_ctime_ns, tiny.parent)
            os.chmod(_blob_path(tiny, victim), 0o444)  # a metadata change: the ctime moves
        return result

    monkeypatch.setattr(objects_module.os, "fstat", fstat_then_touch)
    assert s.objects.hash_file(victim) == victim
    monkeypatch.setattr(objects_module.os, "fstat", real_fstat)
    assert not s.objects.trusted(victim)
