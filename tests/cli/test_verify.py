"""`slm verify`: integrity and numerics against the fresh-base oracle (tiny model)."""

from __future__ import annotations

import os

import pytest

from helpers import one_line

pytestmark = pytest.mark.oracle  # the adapters come from peft (scripts/make_adapters.py)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_model):
    import make_adapters

    return make_adapters.make_adapters(tiny_model["hf"], tmp_path_factory.mktemp("verify-adapters"), seed=3)


@pytest.fixture
def tiny(cli, store, tiny_model, adapters):
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    for name in ("lora", "lora2", "ia3", "shira"):
        assert cli("import", "adapter", adapters[name], "--name", name).code == 0
    return store


@pytest.mark.parametrize("composition", [[], ["lora"], ["ia3"], ["shira"], ["lora@0.7", "lora2@0.3"],
                                         ["ia3", "lora@-0.5"], ["lora", "ia3", "shira@2"]])
def test_verify_passes(cli, tiny, composition):
    assert cli("activate", "tq", *composition).code == 0
    r = cli("verify", "--json")
    assert r.code == 0, r.err
    report = r.json()
    assert report["integrity"]["ok"] and report["numerics"]["ok"]
    assert report["numerics"]["top1_agreement"] == 1.0
    assert report["numerics"]["max_abs_error"] < 1e-4


def test_flipped_byte_fails_integrity(cli, tiny, store_dir):
    assert cli("activate", "tq", "lora").code == 0
    digest = cli("show", "lora", "--json").json()["targets"][0]["tensors"]["B"]
    blob = store_dir / "objects" / "blake3" / digest[7:]
    os.chmod(blob, 0o644)
    data = bytearray(blob.read_bytes())
    data[7] ^= 0x10
    blob.write_bytes(bytes(data))
    r = cli("verify")
    assert r.code == 5 and one_line(r.err)
    assert cli("verify", "--no-numerics").code == 5


def test_scale_off_by_one_percent_fails_numerics(cli, tiny, monkeypatch):
    from slm.model import overlays

    real_build = overlays.build_overlay

    def off_by_one_percent(kind, weight, targets, **kw):
        return real_build(kind, weight * 1.01, targets, **kw)

    assert cli("activate", "tq", "lora").code == 0
    monkeypatch.setattr(overlays, "build_overlay", off_by_one_percent)  # staging looks it up there
    r = cli("verify", "--json")
    assert r.code == 10, r.err
    assert r.json()["numerics"]["ok"] is False and one_line(r.err)
    assert cli("verify", "--no-numerics").code == 0, "the bytes are fine"


def test_verify_a_base_by_name_and_nothing_active(cli, tiny):
    assert cli("verify").code == 3
    assert cli("verify", "tq").code == 0
