"""The in-process runtime: staged compositions switch by reference, outputs stay exact."""

from __future__ import annotations

import numpy as np

from slm.ops.infer.staging import StagedCompositions


def test_switching_in_process_is_exact(cli, store, tiny_model, tmp_path):
    import make_random_lora

    lora = make_random_lora.make_random_lora(tmp_path / "l", rank=4, hidden=64, intermediate=128,
                                             layers=2, kv_dim=32)
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("import", "adapter", lora, "--name", "a").code == 0
    base_id = cli("activate", "tq", "--json").json()["active"]["id"]
    lora_id = cli("activate", "tq", "a", "--json").json()["active"]["id"]
    rt = StagedCompositions(store)
    ids = np.asarray([5, 17, 42, 99])

    def logits(loaded):
        m = loaded.model
        return m.forward(ids, m.new_cache(len(ids)), "all")

    b1 = logits(rt.switch(base_id))
    a1 = logits(rt.switch(lora_id))
    b2 = logits(rt.switch(base_id))
    assert np.array_equal(b1, b2) and not np.array_equal(a1, b1)
    assert rt.staged[lora_id].model.t is rt.staged[base_id].model.t, "one base mapping shared"


def test_staged_compositions_are_evicted_least_recently_used_first(cli, store, tiny_model, tmp_path):
    import make_random_lora

    lora = make_random_lora.make_random_lora(tmp_path / "l", rank=4, hidden=64, intermediate=128,
                                             layers=2, kv_dim=32)
    assert cli("import", "base", tiny_model["gguf_q"], "--name", "tq").code == 0
    assert cli("import", "base", tiny_model["gguf"], "--name", "tf").code == 0
    assert cli("import", "adapter", lora, "--name", "a").code == 0
    a, b, c = (cli("activate", *spec, "--json").json()["active"]["id"] for spec in (["tq"], ["tf"], ["tq", "a"]))
    rt = StagedCompositions(store, max_staged=2)
    rt.stage(a)
    rt.stage(b)
    rt.stage(a)  # used again: now the most recent
    rt.stage(c)  # over the limit: the least recently used (b) goes
    assert list(rt.staged) == [a, c]
