"""The drift experiment: destructive merge/unmerge into the Q4_1 base vs slm's overlays.

    python scripts/drift.py [--out docs] [--cycles 1 2 5 10]

On SmolLM2-135M-Instruct Q4_1 with two random LoRA adapters A and B (r=8 on all seven
projections, scripts/make_random_lora.py):

* destructive: W_q <- Q(deq(W_q) + dA) (merge), W_q <- Q(deq(W_q) - dA) (unmerge), as PEFT
  does for 4-bit bases; repeated k times. After k cycles we measure (1) the base's logits
  against the pristine base and (2) the logits with A merged once more against the
  fresh-base oracle (float64 W + dA, no intermediate quantization, as `slm verify` computes).
* overlay: slm never merges, so its error against the same oracle is the same for every k.
* order: A-then-B vs B-then-A, merged destructively vs applied as overlays.

Writes docs/drift.json and docs/drift.png (matplotlib) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_random_lora  # noqa: E402
import smollm2_path  # noqa: E402

from slm.model.decoder import Decoder  # noqa: E402
from slm.model.weights import QuantTensor  # noqa: E402
from slm.ops.infer import compositions  # noqa: E402
from slm.ops.store.importing import import_adapter, import_base  # noqa: E402
from slm.ops.infer.loading import load_composition  # noqa: E402
from slm.ops.infer.verify import oracle  # noqa: E402
from slm.store import init_store  # noqa: E402

PROMPT = "Once upon a time, in a small village, the capital of France was 2024 km away."


def deltas(store, loaded) -> dict[str, np.ndarray]:
    """Each adapted weight's dense float64 delta, in the base's row layout (via the oracle)."""
    reference = oracle(store, loaded.staged, loaded.model.t)
    out = {}
    for name in reference.adapters[0].targets:
        w = loaded.model.t[name]
        out[name] = reference.weight(name) - w.dequantize().astype(np.float64)
    return out


def requantized(tensors: dict[str, QuantTensor], delta: dict[str, np.ndarray], sign: float) -> dict:
    """W_q <- Q(deq(W_q) + sign * delta) for every adapted weight (one destructive step)."""
    out = dict(tensors)
    for name, d in delta.items():
        w = tensors[name]
        merged = (w.dequantize().astype(np.float64) + sign * d).astype(np.float32)
        raw = w.codec.quantize(merged)  # (rows, bytes per row)
        out[name] = QuantTensor(name, w.shape, w.codec, raw.reshape(w.rows, -1))
    return out


def logits(cfg, tensors, ids, overlays=()) -> np.ndarray:
    model = Decoder(cfg, tensors, overlays=overlays)
    return model.forward(ids, model.new_cache(len(ids)), "all").astype(np.float64)


def run(cycles: list[int], work: Path) -> dict:
    store, _ = init_store(work / "store")
    import_base(store, smollm2_path.locate(), "smollm2")
    for seed, name in ((1, "A"), (2, "B")):
        import_adapter(store, make_random_lora.make_random_lora(work / name, seed=seed), name)
    base = load_composition(store, compositions.build(store, "smollm2", []))
    with_a = load_composition(store, compositions.build(store, "smollm2", ["A"]))
    with_b = load_composition(store, compositions.build(store, "smollm2", ["B"]))
    cfg, pristine = base.model.cfg, base.model.t
    ids = np.asarray(base.tokenizer.encode(PROMPT))
    d_a, d_b = deltas(store, with_a), deltas(store, with_b)

    base_logits = logits(cfg, pristine, ids)
    oracle_a = oracle(store, with_a.staged, pristine).logits(ids)
    overlay_a = with_a.model.forward(ids, with_a.model.new_cache(len(ids)), "all").astype(np.float64)
    overlay_err = float(np.abs(overlay_a - oracle_a).max())

    rows = []
    tensors = pristine
    for k in range(1, max(cycles) + 1):
        tensors = requantized(requantized(tensors, d_a, +1.0), d_a, -1.0)  # one merge + unmerge
        if k in cycles:
            merged_again = logits(cfg, requantized(tensors, d_a, +1.0), ids)
            rows.append({
                "k": k,
                "base_drift_max": float(np.abs(logits(cfg, tensors, ids) - base_logits).max()),
                "destructive_vs_oracle_max": float(np.abs(merged_again - oracle_a).max()),
                "destructive_vs_oracle_mean": float(np.abs(merged_again - oracle_a).mean()),
                "overlay_vs_oracle_max": overlay_err,
                "changed_bytes": int(sum(np.count_nonzero(tensors[n].data != pristine[n].data) for n in d_a)),
            })
            print(f"k={k}: {rows[-1]}", flush=True)

    ab = logits(cfg, requantized(requantized(pristine, d_a, 1.0), d_b, 1.0), ids)
    ba = logits(cfg, requantized(requantized(pristine, d_b, 1.0), d_a, 1.0), ids)
    ov_ab = load_composition(store, compositions.build(store, "smollm2", ["A", "B"])).model
    ov_ba = load_composition(store, compositions.build(store, "smollm2", ["B", "A"])).model
    l_ab = ov_ab.forward(ids, ov_ab.new_cache(len(ids)), "all")
    l_ba = ov_ba.forward(ids, ov_ba.new_cache(len(ids)), "all")
    return {
        "prompt": PROMPT, "positions": int(len(ids)), "adapters": "random LoRA r=8 on q,k,v,o,gate,up,down",
        "cycles": rows,
        "order": {
            "destructive_ab_vs_ba_max": float(np.abs(ab - ba).max()),
            "overlay_ab_vs_ba_max": float(np.abs(l_ab - l_ba).max()),
            "destructive_top1_agreement": float(np.mean(ab.argmax(-1) == ba.argmax(-1))),
        },
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["k"] for r in result["cycles"]]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(ks, [r["destructive_vs_oracle_max"] for r in result["cycles"]], "o-",
            label="destructive merge/unmerge, then merge")
    ax.plot(ks, [r["base_drift_max"] for r in result["cycles"]], "s--", label="base after k cycles vs pristine base")
    ax.plot(ks, [r["overlay_vs_oracle_max"] for r in result["cycles"]], "^-", label="slm overlay (never merged)")
    ax.set_xlabel("merge/unmerge cycles k")
    ax.set_ylabel("max abs logit error")
    ax.set_yscale("log")
    ax.set_xticks(ks)
    ax.set_title("SmolLM2-135M Q4_1 + LoRA r=8: error vs the fresh-base oracle")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE.parent / "docs")
    p.add_argument("--cycles", type=int, nargs="+", default=[1, 2, 5, 10])
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="slm-drift-") as tmp:
        result = run(sorted(a.cycles), Path(tmp))
    (a.out / "drift.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, a.out / "drift.png")
    print("| k | base drift (max) | destructive vs oracle (max) | overlay vs oracle (max) | bytes changed |")
    print("|---:|---:|---:|---:|---:|")
    for r in result["cycles"]:
        print(f"| {r['k']} | {r['base_drift_max']:.3g} | {r['destructive_vs_oracle_max']:.3g} | "
              f"{r['overlay_vs_oracle_max']:.3g} | {r['changed_bytes']} |")
    print(json.dumps(result["order"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
