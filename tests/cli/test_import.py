"""`slm import base` on the synthetic tiny Llama (GGUF and Hugging Face forms) and bad input."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from helpers import one_line, snapshot
from slm import quant
from slm.compose.base_manifest import parse_base_manifest
from slm.formats import llama
from slm.store.sync_pool import Syncs
from slm.formats.safetensors_io import SafetensorsFile


def _manifest(store, digest):
    return parse_base_manifest(store.objects.read_verified(digest))


def test_gguf_import_keeps_every_supported_type(cli, store, tiny_model):
    r = cli("import", "base", tiny_model["gguf_q"], "--name", "tiny-q", "--json")
    assert r.code == 0, r.err
    m = _manifest(store, r.json()["digest"])
    assert {t.dtype for t in m.tensors} == {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"}
    assert m.qk_row_layout == "gguf" and m.source_format == "gguf"
    assert m.architecture["num_kv_heads"] == 2 and not m.architecture["tie_word_embeddings"]
    tok = json.loads(store.objects.read_verified(m.tokenizer_digest))
    assert tok["source"] == "gguf" and tok["fields"]["ggml.model"] == "gpt2"
    assert "chat_template" in tok["fields"]


@pytest.mark.parametrize("profile", ["q8_0", "q4_0", "q4_1", "nf4", "f16", "f32"])
def test_hf_import_quantizes_to_profile(cli, store, tiny_model, profile):
    r = cli("import", "base", tiny_model["hf"], "--name", f"hf-{profile}", "--quant", profile, "--json")
    assert r.code == 0, r.err
    m = _manifest(store, r.json()["digest"])
    assert m.qk_row_layout == "hf" and m.quant_profile == profile
    weights = SafetensorsFile(tiny_model["hf"] / "model.safetensors")
    for t in m.tensors:
        assert t.dtype == (profile if len(t.shape) == 2 else "f32")
        hf_name = llama.gguf_to_hf_module(t.name) + ".weight"
        codec = quant.get_codec(t.dtype)
        stored = codec.dequantize(store.objects.read_verified(t.digest), t.shape)
        expected = codec.dequantize(codec.quantize(weights.float32(hf_name)), t.shape)
        np.testing.assert_array_equal(stored, expected, err_msg=t.name)


def test_sharded_checkpoint_gives_the_same_base(cli, store, tiny_model):
    one = cli("import", "base", tiny_model["hf"], "--name", "one", "--json")
    two = cli("import", "base", tiny_model["hf_sharded"], "--name", "two", "--json")
    assert one.code == two.code == 0
    assert one.json()["digest"] == two.json()["digest"]
    # only the record of where it came from (another directory) is new: no tensor is stored twice
    assert two.json()["new_blobs"] == 1 and two.json()["new_bytes"] < 1024


def test_gguf_and_hf_import_agree_on_weights(cli, store, tiny_model):
    g = _manifest(store, cli("import", "base", tiny_model["gguf"], "--name", "g", "--json").json()["digest"])
    h = _manifest(store, cli("import", "base", tiny_model["hf"], "--name", "h", "--quant", "f32",
                             "--json").json()["digest"])
    hm = h.tensor_map
    for t in g.tensors:
        a = quant.get_codec(t.dtype).dequantize(store.objects.read_verified(t.digest), t.shape)
        b = quant.get_codec("f32").dequantize(store.objects.read_verified(hm[t.name].digest), t.shape)
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = g.architecture["num_heads" if "attn_q" in t.name else "num_kv_heads"]
            b = llama.permute_hf_to_gguf(b, heads)
        np.testing.assert_array_equal(a, b, err_msg=t.name)


def test_bf16_checkpoint_is_widened_exactly(cli, store, tiny_model, tmp_path):
    src = tiny_model["hf"]
    dst = tmp_path / "bf16"
    dst.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (dst / f).write_bytes((src / f).read_bytes())
    weights = SafetensorsFile(src / "model.safetensors")
    bf16 = {n: (weights.float32(n).view(np.uint32) >> 16).astype(np.uint16) for n in weights.tensors}
    _save_with_dtype(dst / "model.safetensors", bf16, "BF16")
    r = cli("import", "base", dst, "--name", "bf", "--quant", "f32", "--json")
    assert r.code == 0, r.err
    m = _manifest(store, r.json()["digest"])
    t = m.tensor_map["blk.0.ffn_up.weight"]
    stored = np.frombuffer(store.objects.read_verified(t.digest), np.float32).reshape(t.shape)
    expected = (bf16["model.layers.0.mlp.up_proj.weight"].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(stored, expected)


def _save_with_dtype(path, arrays: dict, dtype: str) -> None:
    """Write a safetensors file whose header says `dtype` (NumPy has no bfloat16)."""
    header, blobs, offset = {}, [], 0
    for name, arr in arrays.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


# --- bad input: a one-line error, a non-zero exit code, and an unchanged store -----------

def _assert_rejected(cli, store_dir, args, code):
    before = snapshot(store_dir)
    r = cli(*args)
    assert r.code == code, (r.code, r.err)
    assert one_line(r.err) and r.err.startswith("slm: error: "), r.err
    assert snapshot(store_dir) == before, "a failed import changed the store"
    return r


def test_truncated_gguf(cli, store, store_dir, tiny_model, tmp_path):
    data = tiny_model["gguf_q"].read_bytes()
    for cut in (10, 100, len(data) // 2, len(data) - 1):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        r = _assert_rejected(cli, store_dir, ["import", "base", bad, "--name", "x"], 4)
        assert "truncated" in r.err or "not a GGUF" in r.err or "past the end" in r.err


def test_unsupported_tensor_type(cli, store, store_dir, tiny_model):
    r = _assert_rejected(cli, store_dir, ["import", "base", tiny_model["gguf_unsupported"], "--name", "x"], 4)
    assert "MXFP4" in r.err and "Q4_1" in r.err, "names the type and lists the supported ones"


def test_directory_that_is_not_a_checkpoint(cli, store, store_dir, tmp_path):
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    _assert_rejected(cli, store_dir, ["import", "base", empty, "--name", "x"], 4)
    (empty / "notes.txt").write_text("hello")
    _assert_rejected(cli, store_dir, ["import", "base", empty / "notes.txt", "--name", "x"], 4)
    _assert_rejected(cli, store_dir, ["import", "base", tmp_path / "missing", "--name", "x"], 3)


def test_checkpoint_with_only_pickles_is_refused(cli, store, store_dir, tiny_model, tmp_path):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_bytes((tiny_model["hf"] / "config.json").read_bytes())
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    r = _assert_rejected(cli, store_dir, ["import", "base", d, "--name", "x"], 4)
    assert "unpickle" in r.err


def _lying_checkpoint(tiny_model, tmp_path, mutate) -> object:
    src = tiny_model["hf"]
    d = tmp_path / "lying"
    d.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (d / f).write_bytes((src / f).read_bytes())
    raw = (src / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    mutate(header)
    head = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + raw[8 + n:])
    return d


@pytest.mark.parametrize("lie", ["past_end", "overlap", "size", "dtype"])
def test_safetensors_header_that_lies(cli, store, store_dir, tiny_model, tmp_path, lie):
    def mutate(header):
        name = "model.layers.1.mlp.down_proj.weight"
        begin, end = header[name]["data_offsets"]
        if lie == "past_end":
            header[name]["data_offsets"] = [begin + 10**9, end + 10**9]
        elif lie == "overlap":
            other = header["model.layers.0.mlp.up_proj.weight"]["data_offsets"]
            header[name]["data_offsets"] = [other[0], other[0] + (end - begin)]
        elif lie == "size":
            header[name]["data_offsets"] = [begin, end - 4]
        else:
            header[name]["dtype"] = "F16"

    d = _lying_checkpoint(tiny_model, tmp_path, mutate)
    r = _assert_rejected(cli, store_dir, ["import", "base", d, "--name", "x"], 4)
    assert "down_proj" in r.err or "overlap" in r.err


def test_safetensors_header_length_lies(cli, store, store_dir, tiny_model, tmp_path):
    d = _lying_checkpoint(tiny_model, tmp_path, lambda h: None)
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + raw[8:])
    _assert_rejected(cli, store_dir, ["import", "base", d, "--name", "x"], 4)


def test_non_finite_weight_is_refused(cli, store, store_dir, tiny_model, tmp_path):
    d = tmp_path / "nan"
    d.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (d / f).write_bytes((tiny_model["hf"] / f).read_bytes())
    weights = SafetensorsFile(tiny_model["hf"] / "model.safetensors")
    arrays = {n: weights.float32(n).copy() for n in weights.tensors}
    arrays["model.layers.1.mlp.up_proj.weight"][3, 5] = np.nan
    save_file(arrays, str(d / "model.safetensors"))
    r = _assert_rejected(cli, store_dir, ["import", "base", d, "--name", "x", "--quant", "q4_1"], 4)
    assert "up_proj" in r.err and "non-finite" in r.err


@pytest.mark.parametrize("name", ["a/b", "../up", "..", "x\ty", "-dash"])
def test_bad_names(cli, store, store_dir, tiny_model, name):
    _assert_rejected(cli, store_dir, ["import", "base", tiny_model["gguf"], "--name", name], 4)


def test_import_under_a_taken_name_moves_the_name(cli, store, store_dir, tiny_model):
    """Names are refs (issue 32): a different base under a taken name moves the name; the old
    base stays, reachable through the name's log."""
    first = cli("import", "base", tiny_model["gguf"], "--name", "taken", "--json").json()["digest"]
    r = cli("import", "base", tiny_model["gguf_q"], "--name", "taken", "--json")
    assert r.code == 0 and r.json()["previous"] == first
    assert cli("show", "taken", "--json").json()["digest"] == r.json()["digest"] != first
    log = cli("log", "taken", "--json").json()
    assert [(e["old"], e["new"]) for e in log] == [(first, r.json()["digest"]), (None, first)]


def test_quant_flag_on_gguf_and_unknown_profile(cli, store, store_dir, tiny_model):
    _assert_rejected(cli, store_dir, ["import", "base", tiny_model["gguf"], "--name", "x", "--quant", "q4_0"], 4)
    _assert_rejected(cli, store_dir, ["import", "base", tiny_model["hf"], "--name", "x", "--quant", "q3_k"], 4)


def test_import_without_a_store(cli, tiny_model):
    r = cli("import", "base", tiny_model["gguf"], "--name", "x")
    assert r.code == 3 and "slm init" in r.err


def test_json_errors_are_machine_readable(cli, store, tiny_model, tmp_path):
    r = cli("import", "base", tmp_path / "missing", "--name", "x", "--json")
    assert r.code == 3
    assert r.json() == {"error": r.err.strip().removeprefix("slm: error: "), "exit_code": 3}


def test_a_failed_write_on_the_sync_threads_fails_the_import_before_anything_is_named(
        cli, store, store_dir, tiny_model, monkeypatch):
    """Staged files are written on the same pool (slm.store.sync_pool.Syncs) while the caller hashes
    the next tensors; a full disk there is reported at the barrier, one line, exit 12, before
    any blob is linked or the name is set, and the staging area is gone."""
    import errno
    import os
    import threading

    from slm.store import fs

    real_write = fs.NewFile._write_now
    failing = []

    def write(self, data):
        if "stage" in str(self.path) and not failing:  # the first staged tensor's
            failing.append(threading.current_thread().name)
            raise fs._io_error("write", self.path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        real_write(self, data)

    monkeypatch.setattr(fs.NewFile, "_write_now", write)
    before = snapshot(store_dir)
    r = cli("import", "base", tiny_model["gguf_q"], "--name", "tq")
    assert failing and failing[0].startswith("slm-fsync"), failing  # written off the caller's thread
    assert r.code == 12 and one_line(r.err) and "No space left" in r.err, r.err
    assert snapshot(store_dir) == before
    assert list((store_dir / "tmp").iterdir()) == []


def test_a_failed_fsync_on_the_sync_threads_fails_the_import_before_anything_is_named(
        cli, store, store_dir, tiny_model, monkeypatch):
    """Staged files are fsynced on a pool (slm.store.sync_pool.Syncs) while the next are written; one
    that fails is reported at the barrier, before any blob is linked or the name is set."""
    import errno
    import os

    from slm.store import fs

    real_fsync = fs._fsync
    failing = []

    def fsync(fd, path):
        if "stage" in str(path) and not failing:  # the first staged tensor's
            failing.append(path)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd, path)

    monkeypatch.setattr(fs, "_fsync", fsync)
    before = snapshot(store_dir)
    r = cli("import", "base", tiny_model["gguf_q"], "--name", "tq")
    assert failing, "no staged file was fsynced"
    assert r.code == 12 and one_line(r.err) and "fsync" in r.err, r.err
    assert snapshot(store_dir) == before
    assert list((store_dir / "tmp").iterdir()) == []


def test_the_sync_threads_hold_a_bounded_part_of_the_bytes(tmp_path, monkeypatch):
    """Syncs keeps at most IN_FLIGHT_BYTES of unwritten bytes: past them the caller waits for
    the oldest job (a checkpoint quantized in memory is not held whole when the disk lags)."""
    import threading

    from slm.store import fs

    monkeypatch.setattr(Syncs, "IN_FLIGHT_BYTES", 3000)
    gate = threading.Event()
    real = Syncs._write_sync_and_close_now
    started = []

    def slow(f, pieces):
        started.append(f.path.name)
        gate.wait(10)  # (bounded: the test releases it)
        real(f, pieces)

    monkeypatch.setattr(Syncs, "_write_sync_and_close_now", staticmethod(slow))
    syncs = Syncs()
    for i in range(2):  # 2000 bytes in flight: under the bound, the caller goes on
        syncs.write_sync_and_close(fs.NewFile(tmp_path / f"f{i}"), [b"x" * 1000])
    blocked = threading.Thread(target=syncs.write_sync_and_close, args=(fs.NewFile(tmp_path / "f2"), [b"y" * 1500]))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()  # 3500 bytes would be in flight: it waits for the oldest
    gate.set()
    blocked.join(10)
    assert not blocked.is_alive()
    syncs.wait()
    syncs.close()
    assert [(tmp_path / f"f{i}").read_bytes() for i in range(3)] == [b"x" * 1000] * 2 + [b"y" * 1500]
