"""Two source trees of slm against each other on one store, interleaved run by run (issue 34's
before/after: notes/perf-notes.md).

    python scripts/bench_trees.py BEFORE_TREE AFTER_TREE STORE [ROUNDS]

Each tree is a checkout with its C extension built (`python setup.py build_ext --inplace`);
STORE holds a base named `smollm2` (the bundled SmolLM2). Per round, each tree in turn (the
order alternating): `slm run -n 128` decode tok/s, the prefill of a ~460-token prompt (a new
prompt each round: the prompt cache never answers), `slm activate` wall time, and 8 rows
decoded together through slm.model.batch.decode_step. Prints each sample and the medians.
"""
import json, os, statistics, subprocess, sys, time
from pathlib import Path

BEFORE, AFTER = sys.argv[1], sys.argv[2]
STORE = Path(sys.argv[3])
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 5
PY = sys.executable
WORDS = "the quick brown fox jumps over a lazy dog while seven small birds sing in the old oak tree".split()


def env(tree):
    return {**os.environ, "PYTHONPATH": tree, "OMP_WAIT_POLICY": "passive"}


def slm(tree, *args):
    t = time.perf_counter()
    r = subprocess.run([PY, "-m", "slm", "--store", str(STORE), *args], env=env(tree), capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{tree}: {args}: {r.stderr}")
    return r.stdout, time.perf_counter() - t


BATCH = r'''
import sys, time, numpy as np
from slm.store import StoreDir
from slm.ops.infer import compositions
from slm.ops.infer.loading import load_composition
from slm.model.batch import Row, decode_step
from slm.model.kernels import default_kernels
s = StoreDir.open(sys.argv[1])
loaded = load_composition(s, compositions.build(s, "smollm2", []))
m = loaded.model
k = default_kernels()
rows = []
for i in range(8):
    c = m.new_cache(160); m.forward(np.asarray([1, 2, 3 + i]), c, "last"); rows.append(Row(m, c, 5))
t = time.perf_counter()
for _ in range(32):
    decode_step(rows, k)
    for r in rows: r.token = 7
print(8 * 32 / (time.perf_counter() - t))
'''


def batching(tree):
    r = subprocess.run([PY, "-c", BATCH, str(STORE)], env=env(tree), capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr)
    return float(r.stdout.strip())


def sample(tree, rnd):
    out = {}
    prompt = f"Round {rnd} {tree[-4:]}: Once upon a time,"
    j = json.loads(slm(tree, "run", prompt, "-n", "128", "--json")[0])
    out["decode_tok_s"] = j["timings"]["decode_tok_s"]
    long = " ".join(WORDS[(rnd + i) % len(WORDS)] for i in range(460)) + f" {rnd} {tree[-4:]}"
    j = json.loads(slm(tree, "run", long, "-n", "1", "--json")[0])
    out["prefill_tok_s"] = j["timings"]["prefill_tok_s"]
    out["prompt_tokens"] = len(j["prompt_tokens"])
    slm(tree, "activate", "smollm2")  # the same composition: a no-op switch is still an activation
    out["activate_s"] = slm(tree, "activate", "smollm2")[1]
    out["batch8_tok_s"] = batching(tree)
    return out


def main():
    samples = {BEFORE: [], AFTER: []}
    for rnd in range(ROUNDS):
        order = (BEFORE, AFTER) if rnd % 2 == 0 else (AFTER, BEFORE)
        for tree in order:
            time.sleep(1.0)
            samples[tree].append(sample(tree, rnd))
            print(tree, samples[tree][-1], os.getloadavg()[0], flush=True)
    med = {t: {k: statistics.median(s[k] for s in v) for k in v[0]} for t, v in samples.items()}
    print(json.dumps({"before": med[BEFORE], "after": med[AFTER], "samples": samples}, indent=1))


main()
