"""The story of issue 32's first "Must show" (docs/quickstart.md, "Shipping a new version"):
french v1 active, french v2 imported under the same name, the log of the name, the active
composition still v1 byte for byte, `slm tag prod`, `slm run --model prod` leaving refs/active
as it was, `slm activate @active~1`, `slm rm` + `slm gc` freeing exactly the unreachable blobs,
`slm push HOST/r:prod prod` and, after `slm pull` in another store, `slm activate HOST/r:prod`.
The tiny model stands in for SmolLM2; the registry is a real docker-registry on
loopback (tests/distribution/dist_fixtures.py)."""

from __future__ import annotations

import json

from dist_fixtures import registry  # noqa: F401  (fixture)


def test_shipping_french_v2_under_the_same_name(cli, tiny_model, tmp_path, registry):  # noqa: F811
    import make_random_lora

    for seed, name in ((1, "v1"), (2, "v2"), (3, "draft")):
        make_random_lora.make_random_lora(tmp_path / name, seed=seed, rank=4, hidden=64, intermediate=128,
                                          layers=2, kv_dim=32)
    store = tmp_path / "store"

    def slm(*args, code=0):
        r = cli("--store", store, *args)
        assert r.code == code, (args, r.err)
        return r

    def data(*args):
        return json.loads(slm(*args, "--json").out)

    def logits(name, *model):
        slm("run", "Once upon a time", "-n", "4", "--logits-out", tmp_path / name, *model)
        return (tmp_path / name).read_bytes()

    slm("init")
    slm("import", "base", tiny_model["gguf_q"], "--name", "smollm2")
    v1 = data("import", "adapter", tmp_path / "v1", "--name", "french")["digest"]
    v1_comp = data("activate", "smollm2", "french")["active"]["id"]
    on_v1 = logits("v1.npy")

    # french v2 under the same name: the name moves, and says so
    moved = slm("import", "adapter", tmp_path / "v2", "--name", "french")
    v2 = data("show", "french")["digest"]
    assert f"french: {v1[7:19]} -> {v2[7:19]}" in moved.out
    assert [(e["old"], e["new"]) for e in data("log", "french")] == [(v1, v2), (None, v1)]

    # the active composition pins v1's digest: it runs v1, byte for byte, until re-activated
    assert data("status")["active"]["id"] == v1_comp
    assert logits("still-v1.npy") == on_v1

    # a tag names a composition; tagging does not activate
    ref_before = (store / "refs" / "active").read_bytes()
    prod = data("tag", "prod", "smollm2+french@0.8")["new"]
    assert (store / "refs" / "active").read_bytes() == ref_before
    # run it without activating it: refs/active and its log stay as they were
    log_before = (store / "logs" / "active").read_bytes()
    tried = logits("tried.npy", "--model", "prod")
    assert (store / "refs" / "active").read_bytes() == ref_before
    assert (store / "logs" / "active").read_bytes() == log_before
    assert data("activate", "prod")["active"]["id"] == prod
    on_prod = logits("prod.npy")
    assert on_prod != on_v1  # v2 at 0.8 is another model
    assert tried == on_prod  # what `run --model prod` ran is what activating prod runs

    # @active~1: the composition before the last transition
    assert data("activate", "@active~1")["active"]["id"] == v1_comp
    assert logits("back.npy") == on_v1

    # rm + gc: the name's log keeps its target for gc.reflog_expiry; --prune-now frees exactly it
    draft = data("import", "adapter", tmp_path / "draft", "--name", "draft")
    shown = data("show", "draft")
    draft_blobs = {shown["digest"]} | {d for t in shown["targets"] for d in t["tensors"].values()}
    slm("rm", "draft")
    assert data("gc")["blobs"] == []
    pruned = slm("gc", "--prune-now")
    assert f"freed {len(draft_blobs)} blobs" in pruned.out
    assert not any((store / "objects" / "blake3" / d[7:]).exists() for d in draft_blobs)
    assert draft["new_blobs"] == len(draft_blobs)
    slm("fsck")

    # push the tag; pull it elsewhere; activate it there by its registry reference
    ref = f"{registry.host}/r:prod"
    assert data("push", ref, "prod")["composition_id"] == prod
    elsewhere = tmp_path / "elsewhere"
    assert cli("--store", elsewhere, "init").code == 0
    assert cli("--store", elsewhere, "pull", ref).code == 0
    r = cli("--store", elsewhere, "activate", ref, "--json")
    assert r.code == 0 and json.loads(r.out)["active"]["id"] == prod
    assert cli("--store", elsewhere, "run", "Once upon a time", "-n", "4",
               "--logits-out", tmp_path / "elsewhere.npy").code == 0
    assert (tmp_path / "elsewhere.npy").read_bytes() == on_prod
