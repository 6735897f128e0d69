"""`slm import base` copies a GGUF's large tensors into the store with O_DIRECT (slm.store.fs_direct:
no page-cache copy, no writeback pass), and falls back to the page cache's copy wherever the file
system refuses it: the same blobs either way, each verified, and an I/O error fails the import
before anything is named (notes/perf-notes.md, issue 35)."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

import slm
from helpers import refused
from slm.compose.base_manifest import parse_base_manifest
from slm.store import fs_direct


@pytest.fixture
def direct_for_small_files(monkeypatch):
    """The tiny model's tensors are KBs: let every one of a whole block or more go direct."""
    monkeypatch.setattr(fs_direct, "MIN_BYTES", fs_direct.ALIGN)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model) -> str:
    """The base's digest imported through the page cache only."""
    saved = fs_direct.MIN_BYTES
    fs_direct.MIN_BYTES = 1 << 62
    try:
        return slm.Store.init(tmp_path_factory.mktemp("ref") / "s").import_base(tiny_model["gguf_q"], "b").digest
    finally:
        fs_direct.MIN_BYTES = saved


def _blobs_verify(store: slm.Store, name: str) -> bool:
    s = store._s
    base = parse_base_manifest(s.objects.read_verified(s.names.get("bases", name)))
    return all(s.objects.verify(d) for d in base.blob_digests())


def _direct(fd: int) -> bool:
    """Whether `fd` is open with O_DIRECT (what fs_direct's writes are, and no other write)."""
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)


def _count_direct(monkeypatch) -> list[int]:
    copied: list[int] = []
    real = fs_direct.copy_aligned

    def counting(*args):
        n = real(*args)
        copied.append(n)
        return n
    monkeypatch.setattr(fs_direct, "copy_aligned", counting)
    return copied


def test_large_tensors_go_direct_and_the_store_holds_the_same_blobs(tmp_path, tiny_model, reference,
                                                                     direct_for_small_files, monkeypatch):
    copied = _count_direct(monkeypatch)
    store = slm.Store.init(tmp_path / "s")
    assert store.import_base(tiny_model["gguf_q"], "b").digest == reference
    assert any(n > 0 for n in copied), "no tensor went through O_DIRECT"
    assert _blobs_verify(store, "b")


def test_a_file_system_that_refuses_o_direct_gets_the_page_cache_copy(tmp_path, tiny_model, reference,
                                                                       direct_for_small_files, monkeypatch):
    real_fcntl = fcntl.fcntl

    def no_direct(fd, cmd, arg=0):
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_fcntl(fd, cmd, arg)
    monkeypatch.setattr(fcntl, "fcntl", no_direct)
    copied = _count_direct(monkeypatch)
    store = slm.Store.init(tmp_path / "s")
    assert store.import_base(tiny_model["gguf_q"], "b").digest == reference
    assert copied and not any(copied)  # tried, refused, copied the other way
    assert _blobs_verify(store, "b")


def test_a_direct_write_refused_midway_is_finished_through_the_page_cache(tmp_path, tiny_model, reference,
                                                                           direct_for_small_files, monkeypatch):
    writes = []
    real_write = os.write

    def second_write_refused(fd, data):
        if not _direct(fd):
            return real_write(fd, data)
        writes.append(len(data))
        if len(writes) % 2 == 0:  # every other direct write: EINVAL, as for a misaligned device
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_write(fd, data)
    monkeypatch.setattr(fs_direct.os, "write", second_write_refused)
    monkeypatch.setattr(fs_direct, "BUFFER", fs_direct.ALIGN)  # several writes per tensor
    store = slm.Store.init(tmp_path / "s")
    assert store.import_base(tiny_model["gguf_q"], "b").digest == reference
    assert len(writes) >= 2
    assert _blobs_verify(store, "b")


def test_an_io_error_on_a_direct_write_fails_the_import_and_changes_nothing(cli, store, store_dir, tiny_model,
                                                                            direct_for_small_files, monkeypatch):
    real_write = os.write

    def failing_disk(fd, data):
        if not _direct(fd):
            return real_write(fd, data)
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(fs_direct.os, "write", failing_disk)
    r = refused(cli, store_dir, 12, "import", "base", tiny_model["gguf_q"], "--name", "b")
    assert "Input/output error" in r.err
