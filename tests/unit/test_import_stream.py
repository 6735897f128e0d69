"""The streamed GGUF import (slm.ops.store.importing._checked, slm.store.fs_direct): every byte stored
is the file's, every block scale is checked finite, and a lying header string array is refused
before anything of its claimed size is allocated."""

from __future__ import annotations

import shutil
import struct
import tracemalloc

import blake3
import gguf as gguf_py
import numpy as np
import pytest
from helpers import snapshot

from slm.errors import InvalidInput
from slm.formats.gguf import read_gguf
from slm.ops.store.importing import import_base
from slm.ops.store.resolve import load_base
from slm.quant import get_codec
from slm.quant.base import all_finite_floats


def _file_tensors(path) -> dict[str, tuple[int, int, str]]:
    """name -> (offset, bytes, type) of each tensor, read by the `gguf` package (not slm's reader)."""
    return {t.name: (int(t.data_offset), int(t.n_bytes), t.tensor_type.name)
            for t in gguf_py.GGUFReader(str(path)).tensors}


def test_each_imported_tensor_blob_is_blake3_of_its_file_range(store, tiny_model):
    path = tiny_model["gguf_q"]
    import_base(store, path, "tq")
    records = {t.name: t for t in load_base(store, "tq")[1].tensors}
    ranges = _file_tensors(path)
    assert set(records) == set(ranges)
    data = path.read_bytes()
    for name, (offset, size, _) in ranges.items():
        expected = data[offset:offset + size]
        record = records[name]
        assert record.nbytes == size, name
        assert record.digest == "blake3:" + blake3.blake3(expected).hexdigest(), name
        assert store.objects.path(record.digest).read_bytes() == expected, name


def _blocked_tensor(path) -> tuple[str, int, int, object]:
    """(name, offset, bytes, codec) of the largest tensor whose codec checks its block scales."""
    candidates = []
    for name, (offset, size, type_name) in _file_tensors(path).items():
        try:
            codec = get_codec(type_name.lower())
        except Exception:  # noqa: BLE001 - a type slm names differently is simply not a candidate
            continue
        if codec.block_dtype is not None and codec.scale_fields:
            candidates.append((size, name, offset, codec))
    assert candidates, "the tiny quantized GGUF has no block-scaled tensor"
    size, name, offset, codec = max(candidates, key=lambda c: c[0])
    return name, offset, size, codec


@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("bits", [0x7C00, 0xFC00, 0x7E00, 0x7C01], ids=["inf", "-inf", "qnan", "snan"])
def test_a_block_scale_that_is_not_finite_refuses_the_import(store, store_dir, tiny_model, tmp_path, where, bits):
    src = tiny_model["gguf_q"]
    name, offset, size, codec = _blocked_tensor(src)
    field = codec.scale_fields[0]
    assert codec.block_dtype[field] == np.dtype("<f2")
    blocks = size // codec.type_size
    block = 0 if where == "first" else blocks - 1
    at = offset + block * codec.type_size + codec.block_dtype.fields[field][1]
    bad = tmp_path / "bad.gguf"
    shutil.copyfile(src, bad)
    with open(bad, "r+b") as f:
        f.seek(at)
        f.write(struct.pack("<H", bits))
    before = snapshot(store_dir)
    with pytest.raises(InvalidInput, match=f"tensor {name} holds values that are not finite"):
        import_base(store, bad, "bad")
    assert snapshot(store_dir) == before


F16_BITS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def test_all_finite_floats_agrees_with_isfinite_on_every_float16():
    values = F16_BITS.view("<f2")
    finite = np.isfinite(values)
    # each value alone, in the middle of a strided field of finite values (as a block's scale is)
    blocks = np.zeros(3, dtype=[("d", "<f2"), ("qs", "u1", (16,))])
    for bits, expected in zip(F16_BITS.tolist(), finite.tolist()):
        blocks["d"][1] = F16_BITS[bits].view("<f2")
        assert all_finite_floats(blocks["d"]) is expected, hex(bits)


@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<f8"])
def test_all_finite_floats_on_wider_floats(dtype):
    info = np.finfo(np.dtype(dtype).newbyteorder("="))
    field = np.zeros(5, dtype=[("pad", "u1"), ("d", dtype)])["d"]
    for value in (info.max, -info.max, info.tiny, info.smallest_subnormal, -0.0, 1.0):
        field[2] = value
        assert all_finite_floats(field) is True, value
    for value in (np.inf, -np.inf, np.nan, -np.nan):
        field[2] = value
        assert all_finite_floats(field) is False, value
    assert all_finite_floats(field[:0]) is True


def _gguf_with_string_array(count: int, items: list[bytes]) -> bytes:
    """A GGUF header whose one metadata key is a string array claiming `count` items, followed by
    `items` (each a length-prefixed string as written)."""
    key = b"tokenizer.ggml.tokens"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    head += struct.pack("<IIQ", 9, 8, count)
    return head + b"".join(items)


def _string(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


def test_a_string_array_claiming_more_items_than_the_file_holds_is_refused_before_allocating(tmp_path):
    path = tmp_path / "lying.gguf"
    path.write_bytes(_gguf_with_string_array(1 << 40, [_string(b"a")] * 4))
    _refused_within_a_mib(path, "claims 1099511627776 items, more than the file can hold")


def test_a_string_in_an_array_longer_than_the_file_is_refused_before_allocating(tmp_path):
    path = tmp_path / "long-string.gguf"
    # the second string claims 2^50 bytes; the file holds a few
    path.write_bytes(_gguf_with_string_array(3, [_string(b"ok"), struct.pack("<Q", 1 << 50) + b"xyz" * 20]))
    _refused_within_a_mib(path, r"tokenizer\.ggml\.tokens\[1\] runs past the end of the file")


def _refused_within_a_mib(path, match: str) -> None:
    """read_gguf refuses the file with `match`, having allocated less than a MiB on the way."""
    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput, match=match):
            read_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_string_array_cut_inside_a_length_is_refused(tmp_path):
    path = tmp_path / "cut.gguf"
    # room for the claimed count's lengths, but the file ends inside the second string's length
    path.write_bytes(_gguf_with_string_array(2, [_string(b"x" * 20), struct.pack("<Q", 6)[:4]]))
    with pytest.raises(InvalidInput, match=r"tokenizer\.ggml\.tokens\[1\] length runs past the end of the file"):
        read_gguf(path)


def test_a_string_array_is_read_byte_for_byte(tmp_path):
    items = [b"", b"hello", "\u00e9t\u00e9".encode(), b"\xff\xfe", b"x" * 300]
    path = tmp_path / "ok.gguf"
    path.write_bytes(_gguf_with_string_array(len(items), [_string(s) for s in items]) + b"\0" * 64)
    with read_gguf(path) as g:
        got = g.metadata["tokenizer.ggml.tokens"]
    assert [s.encode("utf-8", "surrogateescape") for s in got] == items
