"""The GGUF reader against hand-built hostile headers: bounded, one-line errors."""

from __future__ import annotations

import struct

import pytest

from slm.errors import InvalidInput
from slm.formats.gguf import read_gguf


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _header(n_tensors: int, n_kv: int, body: bytes = b"", version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + body


CASES = {
    "huge tensor count": _header(2**60, 0),
    "huge kv count": _header(0, 2**60),
    "key length past end": _header(0, 1, struct.pack("<Q", 2**40)),
    "string value past end": _header(0, 1, _string(b"k") + struct.pack("<I", 8) + struct.pack("<Q", 2**50)),
    "array count past end": _header(0, 1, _string(b"k") + struct.pack("<IIQ", 9, 4, 2**40)),
    "unknown value type": _header(0, 1, _string(b"k") + struct.pack("<I", 77)),
    "zero dims": _header(1, 0, _string(b"t") + struct.pack("<I", 0)),
    "too many dims": _header(1, 0, _string(b"t") + struct.pack("<I", 9)),
    "zero-sized dim": _header(1, 0, _string(b"t") + struct.pack("<IQ", 1, 0) + struct.pack("<IQ", 0, 0)),
    "version 1": _header(0, 0, version=1),
    "bad magic": b"GGML" + b"\0" * 40,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_header_is_refused(tmp_path, case):
    path = tmp_path / "bad.gguf"
    path.write_bytes(CASES[case] + b"\0" * 8)
    with pytest.raises(InvalidInput) as info:
        read_gguf(path)
    assert "\n" not in str(info.value)


def test_tensor_past_end_is_reported_as_truncated(tmp_path):
    body = _string(b"w") + struct.pack("<IQQ", 2, 32, 4) + struct.pack("<IQ", 0, 0)
    path = tmp_path / "t.gguf"
    path.write_bytes(_header(1, 0, body).ljust(112, b"\0"))
    with pytest.raises(InvalidInput, match="truncated"):
        read_gguf(path, lambda ggml_type, shape: 4 * shape[0] * shape[1])


def test_overlapping_tensors_are_refused(tmp_path):
    body = b"".join(_string(n) + struct.pack("<IQQ", 2, 8, 1) + struct.pack("<IQ", 0, 0) for n in (b"a", b"b"))
    path = tmp_path / "o.gguf"
    path.write_bytes(_header(2, 0, body).ljust(160, b"\0"))
    with pytest.raises(InvalidInput, match="overlap"):
        read_gguf(path, lambda ggml_type, shape: 32)


def test_reads_metadata_of_a_real_file(tiny_model):
    g = read_gguf(tiny_model["gguf"])
    assert g.metadata["general.architecture"] == "llama"
    assert g.metadata["llama.attention.head_count_kv"] == 2
    assert len(g.metadata["tokenizer.ggml.tokens"]) == tiny_model["vocab_size"]
    g.close()
