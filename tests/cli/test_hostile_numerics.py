"""Float32 overflow never passes for an answer: an adapter weight beyond the bound is refused
when a composition is made (exit 4), and an adapter strong enough to overflow the network
within it stops generation on its first non-finite or all-equal row of logits (exit 10), in
both numerics modes, where both used to give an empty answer reported as an end (exit 0,
"eos")."""

from __future__ import annotations

import pytest

from helpers import TINY_LORA, copy_store, one_line, refused, tiny_store

pytestmark = pytest.mark.hostile

MODES = [(), ("--exact",)]


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """`a1`: an ordinary random LoRA; `huge` (another store): one whose B matrices hold values
    around 1e12, which overflows float32 at weight 1 (every logit becomes 0.0)."""
    root = tmp_path_factory.mktemp("numerics")
    shape = {k: TINY_LORA[k] for k in ("rank", "hidden", "intermediate", "layers", "kv_dim")}
    ordinary = tiny_store(root / "ordinary", tiny_model, adapters=1)
    huge = tiny_store(root / "huge", tiny_model, adapters=1, lora={**shape, "std": 1e12})
    return {"ordinary": ordinary, "huge": huge}


@pytest.mark.parametrize("mode", MODES, ids=["int8", "exact"])
@pytest.mark.parametrize("weight", ["1e20", "-1e10", "1000.5"])
def test_a_weight_beyond_the_bound_is_refused_when_composing(cli, template, tmp_path, mode, weight):
    store = copy_store(template["ordinary"], tmp_path)
    refused(cli, store, 4, "activate", "tq", f"a1@{weight}")
    r = refused(cli, store, 4, "run", "The capital of France is", "--model", f"tq+a1@{weight}", *mode)
    assert "weight bound" in r.err


def test_a_weight_at_the_bound_composes(cli, template, tmp_path):
    store = copy_store(template["ordinary"], tmp_path)
    assert cli("--store", store, "activate", "tq", "a1@-1000").code == 0


@pytest.mark.parametrize("mode", MODES, ids=["int8", "exact"])
def test_an_overflowing_adapter_is_a_numerics_error_not_an_empty_answer(cli, template, tmp_path, mode):
    store = copy_store(template["huge"], tmp_path)
    r = cli("--store", store, "run", "The capital of France is", "--model", "tq+a1", "--max-tokens", "4", *mode)
    assert r.code == 10, (r.code, r.out, r.err)
    assert one_line(r.err) and "logits all equal" in r.err and r.out.strip() == ""
