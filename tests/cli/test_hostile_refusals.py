"""The hostile-input suite (issue 11), its refusals (the rest is in test_hostile.py): non-finite
numbers, documented exit codes where there was exit 1, terminal escapes, and a sample of each
class of attack that held. Run with the rest by `pytest -m hostile`.

The promises checked: a refused command changes nothing in the store (a snapshot compares every
file's mode and bytes), prints one line on stderr and exits with a documented code.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import one_line, refused, snapshot
from hostile_fixtures import QUICK, SLM, fsck_clean, slm_proc, store_dir, template  # noqa: F401  (fixtures)
from slm.store import StoreDir
from slm.store import digest as dg

pytestmark = pytest.mark.hostile


# -------------------------------------------------------------------------- non-finite numbers

@pytest.mark.parametrize("weight", ["1e39", "-1e39", "inf", "nan", "3.5e38"])
def test_weights_beyond_float32_are_refused(cli, store_dir, weight):
    refused(cli, store_dir, 4, "activate", "tq", f"a1@{weight}")


def test_weight_times_scale_overflowing_float32_is_refused(cli, store_dir):
    # finite alone, scale 2 overflows; beyond the weight bound too, which refuses it first
    refused(cli, store_dir, 4, "activate", "tq", "a1@3e38")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [0, 37, -1])
def test_an_adapter_tensor_not_finite_in_the_store_is_refused_at_activation(cli, store_dir, value, where):
    """Import refuses a non-finite adapter; an adapter written into the store by other means
    (its blob and manifest well formed, hashing right) is refused when activated: exit 6."""
    import dataclasses

    from slm.compose.adapter_manifest import TensorRef, parse_adapter_manifest

    store = StoreDir.open(store_dir)
    manifest = parse_adapter_manifest(store.objects.read_verified(store.names.resolve("adapters", "a1")))
    target = manifest.targets[0]
    ref = target.tensors["A"]
    values = np.frombuffer(store.objects.read_verified(ref.digest), dtype="<f4").copy()
    values[where] = value
    staging = store.objects.staging()
    bad_ref = TensorRef(staging.put(values.tobytes()), ref.dtype, ref.shape)
    bad_target = dataclasses.replace(target, tensors={**target.tensors, "A": bad_ref})
    bad = dataclasses.replace(manifest, targets=(bad_target, *manifest.targets[1:]))
    digest = staging.put(bad.to_bytes())
    with store.locked():
        staging.commit()
        store.names.set("adapters", "bad", digest)
    staging.discard()
    r = refused(cli, store_dir, 6, "activate", "tq", "bad")
    assert "not finite as float32" in r.err and target.module in r.err


def _f32_tensor_offset(path: Path) -> int:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    for t in reader.tensors:
        if t.tensor_type.name == "F32" and t.n_elements >= 64:
            return int(t.data_offset)
    raise AssertionError("no F32 tensor")


def test_a_nan_inside_a_gguf_f32_tensor_is_refused_at_import(cli, store_dir, template, tmp_path):
    bad = tmp_path / "nan.gguf"
    shutil.copy(template["tiny"]["gguf"], bad)
    offset = _f32_tensor_offset(bad)
    with open(bad, "r+b") as f:
        f.seek(offset + 4 * 5)
        f.write(struct.pack("<f", float("nan")))
    r = refused(cli, store_dir, 4, "import", "base", bad, "--name", "nanbase")
    assert "not finite" in r.err


# ---------------------------------------------------------------- documented codes, not exit 1

def test_a_manifest_naming_a_blob_of_the_wrong_size_is_exit_5(cli, store_dir):
    """A base manifest (well formed, its own digest right) whose tensor names another blob of the
    store (the tokenizer's): the blob hashes fine, its size is not the tensor's. The model
    loader raised a plain ValueError (exit 1); it is damage: exit 5, one line."""
    import tomllib

    from slm.compose.base_manifest import BaseManifest, TensorRecord, parse_base_manifest

    store = StoreDir.open(store_dir)
    base = parse_base_manifest(store.objects.read_verified(store.names.resolve("bases", "tq")))
    first = base.tensors[0]
    assert store.objects.size(base.tokenizer_digest) != first.nbytes
    lying = BaseManifest(base.source_format, base.quant_profile, base.qk_row_layout, base.architecture,
                         base.tokenizer_digest, base.tokenizer_source,
                         (TensorRecord(first.name, first.shape, first.dtype, first.nbytes,
                                       base.tokenizer_digest), *base.tensors[1:]))
    assert tomllib.loads(lying.to_bytes().decode())["tensors"][0]["digest"] == base.tokenizer_digest
    staging = store.objects.staging()
    digest = staging.put(lying.to_bytes())
    with store.locked():
        staging.commit()
        store.names.set("bases", "lying", digest)
    staging.discard()
    r = refused(cli, store_dir, 5, "run", "--base", "lying", "-n", "1", "hello")
    assert first.name in r.err and "bytes" in r.err


def test_read_only_store_gives_exit_12(template, store_dir):
    """Every directory of the store made read-only; the commands run without the capability
    that lets root ignore file modes (setpriv), as any other user would."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    for path in [store_dir, *store_dir.rglob("*")]:
        os.chmod(path, 0o555 if path.is_dir() else 0o444)
    before = snapshot(store_dir)
    try:
        for args in (["activate", "tq"], ["rollback"], ["fsck", "--repair"], ["gc"],
                     ["import", "base", str(template["tiny"]["gguf"]), "--name", "x"]):
            r = subprocess.run([setpriv, "--bounding-set=-dac_override,-dac_read_search", *SLM,
                                "--store", str(store_dir), *args], capture_output=True, timeout=QUICK)
            assert r.returncode == 12, (args, r.returncode, r.stderr)
            assert one_line(r.stderr.decode()), r.stderr
        assert snapshot(store_dir) == before
    finally:
        for path in [store_dir, *store_dir.rglob("*")]:
            if path.is_dir():
                os.chmod(path, 0o755)


def test_a_directory_named_like_an_intent_is_recovered(cli, store_dir):
    (store_dir / "journal" / "d.intent").mkdir()
    assert cli("--store", store_dir, "status").code == 0
    refused(cli, store_dir, 9, "activate", "tq")
    assert cli("--store", store_dir, "fsck").code == 9
    assert cli("--store", store_dir, "fsck", "--repair").code == 0
    fsck_clean(cli, store_dir)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_json_is_refused_everywhere(cli, store_dir, template, tmp_path):
    adapter = tmp_path / "deep"
    shutil.copytree(template["root"] / "lora1", adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["target_modules"] = "__DEEP__"
    (adapter / "adapter_config.json").write_text(json.dumps(config).replace('"__DEEP__"', _nested(200_000)))
    refused(cli, store_dir, 4, "import", "adapter", adapter, "--name", "deep")

    header = ('{"__metadata__": {"x": ' + _nested(200_000) + "}}").encode()
    st = adapter / "adapter_model.safetensors"
    st.write_bytes(struct.pack("<Q", len(header)) + header)
    shutil.copy(template["root"] / "lora1" / "adapter_config.json", adapter / "adapter_config.json")
    refused(cli, store_dir, 4, "import", "adapter", adapter, "--name", "deep")

    hf = tmp_path / "hf"
    shutil.copytree(template["tiny"]["hf"], hf)
    (hf / "config.json").write_text('{"a": ' + _nested(200_000) + "}")
    refused(cli, store_dir, 4, "import", "base", hf, "--name", "deephf")


def test_non_utf8_prompts_are_exit_4(store_dir):
    r = slm_proc(store_dir, "run", "-n", "1", b"caf\xe9 \xff")
    assert r.returncode == 4 and one_line(r.stderr.decode()), r.stderr
    r = subprocess.run([*SLM, "--store", str(store_dir), "run", "-n", "1", "-"], input=b"\xff\xfe bad",
                       capture_output=True, timeout=QUICK)
    assert r.returncode == 4 and one_line(r.stderr.decode()), r.stderr


@pytest.mark.parametrize("args", [["run", "--seed", "-1", "hi"], ["run", "--seed", str(2**64), "hi"],
                                  ["run", "--threads", "0", "hi"], ["run", "--top-p", "0", "hi"],
                                  ["run", "--temperature", "nan", "hi"]])
def test_bad_run_options_are_exit_4(cli, store_dir, args):
    refused(cli, store_dir, 4, *args)


def test_a_nan_lock_timeout_in_config_is_exit_4(cli, store_dir):
    config = store_dir / "config.toml"
    config.write_text(config.read_text().replace("lock_timeout_s = 30.0", "lock_timeout_s = nan"))
    assert "nan" in config.read_text()
    refused(cli, store_dir, 4, "activate", "tq")


# ------------------------------------------------------------------------ terminal escapes

def test_escape_sequences_in_a_manifest_name_are_refused(cli, store_dir, tmp_path):
    store = StoreDir.open(store_dir)
    comp = store.objects.read_verified(store.names.get("compositions", dg.hex_of(store.active_ref.read())))
    text = comp.decode().replace('name = "a2"', 'name = "\\u001b]0;pwn\\u0007"')
    assert "\\u001b" in text
    path = tmp_path / "evil.toml"
    path.write_text(text)
    r = refused(cli, store_dir, 4, "activate", "-f", path)
    assert "\x1b" not in r.err and "\x07" not in r.err
    r = cli("--store", store_dir, "status")
    assert "\x1b" not in r.out


def test_output_escapes_control_characters_from_the_store(cli, store_dir):
    (store_dir / "tmp" / "\x1b]0;pwn\x07junk").write_bytes(b"x")
    r = cli("--store", store_dir, "fsck")
    assert r.code == 9
    assert "\x1b" not in r.out + r.err and "\x07" not in r.out + r.err
    assert "\\x1b" in r.out


# ------------------------------------------------------------------ attacks that held (sample)

@pytest.mark.parametrize("name", ["", "..", "a/b", "-x", " a", "a\n", "\x1b[31mred", "x" * 300, ".hidden",
                                  "a..b", "a b", "$(rm -rf x)", "a;b", "é", "a\\b", "/abs", "a:b"])
def test_hostile_names_are_refused(cli, store_dir, template, name):
    r = refused(cli, store_dir, 4, "import", "adapter", template["root"] / "lora1", "--name", name)
    assert "\x1b" not in r.err


@pytest.mark.parametrize("cut", [0, 3, 4, 24, 100, 1000, -1000, -1])
def test_truncated_gguf_is_refused(cli, store_dir, template, tmp_path, cut):
    data = Path(template["tiny"]["gguf"]).read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut])
    refused(cli, store_dir, 4, "import", "base", bad, "--name", "cut")


@pytest.mark.parametrize("damage", ["no-weights", "config-not-json", "rank-zero", "nan-weight", "pickle-only",
                                    "dora", "wrong-shape"])
def test_hostile_peft_directories_are_refused(cli, store_dir, template, tmp_path, damage):
    from safetensors.numpy import load_file, save_file

    adapter = tmp_path / "peft"
    shutil.copytree(template["root"] / "lora1", adapter)
    st = adapter / "adapter_model.safetensors"
    config_path = adapter / "adapter_config.json"
    tensors = load_file(st)
    key = sorted(tensors)[0]
    if damage == "no-weights":
        st.unlink()
    elif damage == "config-not-json":
        config_path.write_text("{not json")
    elif damage == "rank-zero":
        config_path.write_text(config_path.read_text().replace('"r": 4', '"r": 0'))
    elif damage == "nan-weight":
        tensors[key][0, 0] = np.nan
        save_file(tensors, st)
    elif damage == "pickle-only":
        st.rename(adapter / "adapter_model.bin")
    elif damage == "dora":
        config_path.write_text(config_path.read_text().replace('"use_dora": false', '"use_dora": true'))
        assert '"use_dora": true' in config_path.read_text()
    else:
        tensors[key] = np.zeros((3, 3), np.float32)
        save_file(tensors, st)
    r = cli("--store", store_dir, "import", "adapter", adapter, "--name", "bad")
    assert r.code in (3, 4, 6) and one_line(r.err), (damage, r.code, r.err)
    fsck_clean(cli, store_dir)
    assert StoreDir.open(store_dir).names.get("adapters", "bad") is None


@pytest.mark.parametrize("text", ["not toml [", 'schema = "other"', "", "\x00\xff"])
def test_malformed_composition_manifests_are_refused(cli, store_dir, tmp_path, text):
    path = tmp_path / "m.toml"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
    refused(cli, store_dir, 4, "activate", "-f", path)


def test_a_flipped_byte_in_a_blob_is_found_and_refused(cli, store_dir):
    store = StoreDir.open(store_dir)
    base = store.names.get("bases", "tq")
    from slm.compose.base_manifest import parse_base_manifest

    digest = parse_base_manifest(store.objects.read_verified(base)).blob_digests()[3]
    path = store.objects.path(digest)
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.chmod(path, 0o444)
    assert cli("--store", store_dir, "fsck").code == 5
    refused(cli, store_dir, 5, "activate", "tq", "a1")


def test_an_unsupported_architecture_is_named_and_changes_nothing(cli, store_dir, tmp_path):
    import gguf

    path = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = refused(cli, store_dir, 4, "import", "base", path, "--name", "phi")
    assert "phi3" in r.err


def test_the_float32_factor_check_is_numpys_float32_product():
    """The weight x scale check of an activation (no NumPy) against NumPy's float32 product,
    around float32's largest value and for values past it."""
    from slm.ops.infer.compositions import _finite_in_float32

    big = float(np.finfo(np.float32).max)
    values = [0.0, 1.0, 2.0, 0.5, 1e-45, 1e-38, 3e38, big, big * (1 + 2**-25), big * (1 + 2**-23), 1e39,
              float("inf"), float("nan"), 1.0000001, 1.8446744e19, 1.8446746e19]
    for w in values:
        for s in values:
            for sw in (1, -1):
                with np.errstate(over="ignore", invalid="ignore"):
                    expected = bool(np.isfinite(np.float32(sw * w) * np.float32(s)))
                assert _finite_in_float32(sw * w, s) == expected, (sw * w, s)
