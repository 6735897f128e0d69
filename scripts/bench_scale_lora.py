"""The LoRA figures of scripts/bench_scale.py: random LoRAs r=16 on all seven projections, with
the shape of whatever GGUF is measured, imported beside its base; and what the worker measures
with them (the decode overhead A/B, 8 sequences on 4 compositions).

The adapters are random (scripts/make_random_lora.py): their values say nothing, their sizes are
a real LoRA's (the cost of a LoRA term is its bytes and products, whatever the values).
"""

from __future__ import annotations

import re
from pathlib import Path

import make_random_lora

RANK = 16
ADAPTERS = ("lora16", "lora16b", "lora16c")  # the LoRA composition, and 8-on-4's two others


def lora_shape(gguf: Path) -> dict:
    """make_random_lora's shape arguments read from the file's own tensors (hidden, ffn, layers,
    key/value and query widths), so that any model the bench measures gets a LoRA that fits."""
    import gguf as gguf_py

    # GGUF lists a weight's dims innermost first: (in_features, out_features)
    dims = {t.name: [int(x) for x in t.shape] for t in gguf_py.GGUFReader(str(gguf)).tensors}
    layers = 1 + max(int(m.group(1)) for name in dims if (m := re.match(r"blk\.(\d+)\.", name)))
    return {"hidden": dims["blk.0.attn_q.weight"][0], "intermediate": dims["blk.0.ffn_up.weight"][1],
            "layers": layers, "kv_dim": dims["blk.0.attn_k.weight"][1], "q_dim": dims["blk.0.attn_q.weight"][1]}


def import_loras(store, gguf: Path, work: Path) -> list[str]:
    """ADAPTERS (r=16, seeds 0, 1, 2) made for `gguf`'s shape and imported into `store`; their names."""
    from slm.ops.store.importing import import_adapter

    shape = lora_shape(gguf)
    for seed, name in enumerate(ADAPTERS):
        peft = make_random_lora.make_random_lora(work / name, rank=RANK, alpha=2.0 * RANK, std=0.02, seed=seed, **shape)
        import_adapter(store, peft, name)
    return list(ADAPTERS)
