"""`slm import adapter --base`: the base's tensor shapes complete an adapter that does not
say them all (SHiRA, IA³) and refuse, at import, an adapter that does not fit the base, as an
activation would."""

from __future__ import annotations

import numpy as np

from adapter_format_fixtures import (
    PEFT_WARNINGS,
    LORA_CFG,
    P,
    SHIRA_CFG,
    _gguf_pair,
    _lora_tensors,
    _shira,
    _write_gguf_lora,
    _write_peft,
)
from helpers import one_line, snapshot

pytestmark = PEFT_WARNINGS


def _stored_targets(store, name):
    from slm.compose.adapter_manifest import parse_adapter_manifest, tensor_from_bytes

    manifest = parse_adapter_manifest(store.objects.read_verified(store.names.resolve("adapters", name)))
    return {t.module: (t, {k: tensor_from_bytes(r, store.objects.read_verified(r.digest))
                           for k, r in t.tensors.items()}) for t in manifest.targets}


def test_import_with_base_takes_the_shapes_from_the_base(cli, store, store_dir, tiny_model, tmp_path):
    """A SHiRA adapter on v_proj alone does not say its weight's width (the adapter gives only
    out + in): without --base it is refused, with --base the tiny model's (32, 64) places each
    (row, column) pair at row * 64 + column, and it activates."""
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    rng = np.random.default_rng(13)
    flat = rng.choice(32 * 64, size=96, replace=False)  # r = 1: k = out + in = 96 distinct positions
    rows, cols = np.divmod(flat, 64)
    values = rng.standard_normal(96).astype(np.float32)
    d = _write_peft(tmp_path / "shira_v", {**SHIRA_CFG, "target_modules": ["v_proj"]},
                    _shira(rows, cols, values, "model.layers.0.self_attn.v_proj"))
    before = snapshot(store_dir)
    r = cli("import", "adapter", d, "--name", "sv")
    assert r.code == 4 and "pass the base's tensor shapes" in r.err and snapshot(store_dir) == before
    r = cli("import", "adapter", d, "--name", "sv", "--base", "tq")
    assert r.code == 0, r.err
    target, tensors = _stored_targets(store, "sv")["blk.0.attn_v.weight"]
    assert (target.out_features, target.in_features) == (32, 64)
    order = np.argsort(flat)
    np.testing.assert_array_equal(tensors["indices"], flat[order])
    np.testing.assert_array_equal(tensors["values"], values[order])
    assert cli("activate", "tq", "sv").code == 0


def test_import_with_base_completes_ia3_shapes_and_refuses_a_misfit(cli, store, store_dir, tiny_model, tmp_path):
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    ia3 = {"peft_type": "IA3", "target_modules": ["k_proj"], "feedforward_modules": []}
    vector = np.linspace(0.5, 1.5, 32, dtype=np.float32).reshape(32, 1)  # k_proj (32, 64): (out, 1)
    d = _write_peft(tmp_path / "ia3_k", ia3, {f"{P}model.layers.1.self_attn.k_proj.ia3_l": vector})
    assert cli("import", "adapter", d, "--name", "guessed").code == 0
    assert cli("import", "adapter", d, "--name", "given", "--base", "tq").code == 0
    guessed, _ = _stored_targets(store, "guessed")["blk.1.attn_k.weight"]
    given, tensors = _stored_targets(store, "given")["blk.1.attn_k.weight"]
    assert (guessed.out_features, guessed.in_features) == (32, 0)  # the vector says only `out`
    assert (given.out_features, given.in_features) == (32, 64)
    np.testing.assert_array_equal(tensors["vector"], vector.reshape(-1))
    # an adapter for another model: refused at import as an activation would refuse it (6)
    narrow = _write_peft(tmp_path / "narrow", LORA_CFG, _lora_tensors(np.random.default_rng(1)))
    before = snapshot(store_dir)
    r = cli("import", "adapter", narrow, "--name", "narrow", "--base", "tq")
    assert r.code == 6 and "does not fit" in r.err and one_line(r.err), r.err
    assert snapshot(store_dir) == before
    r = cli("import", "adapter", d, "--name", "x", "--base", "nosuchbase")
    assert r.code == 3 and one_line(r.err)


def test_import_with_base_checks_a_gguf_lora_as_an_activation_would(cli, store, store_dir, tiny_model, tmp_path):
    """A GGUF LoRA is fully shaped by its own tensors; --base checks it against the base at
    import (a k projection as wide as q does not fit the tiny model's (32, 64) attn_k)."""
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    rng = np.random.default_rng(21)
    fits = _write_gguf_lora(tmp_path / "fits.gguf", _gguf_pair(rng, "blk.1.attn_k.weight", out=32, inp=64, r=4))
    misfit = _write_gguf_lora(tmp_path / "misfit.gguf", _gguf_pair(rng, "blk.1.attn_k.weight", out=64, inp=64, r=4))
    assert cli("import", "adapter", fits, "--name", "fits", "--base", "tq").code == 0
    before = snapshot(store_dir)
    r = cli("import", "adapter", misfit, "--name", "misfit", "--base", "tq")
    assert r.code == 6 and one_line(r.err) and "64x64 in the adapter, 32x64 in the base" in r.err, r.err
    assert snapshot(store_dir) == before
    assert cli("import", "adapter", misfit, "--name", "misfit").code == 0, "without --base: refused at activation"
    assert cli("activate", "tq", "misfit").code == 6
