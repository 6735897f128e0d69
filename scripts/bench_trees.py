"""Two source trees of slm against each other on one store, interleaved run by run: a
refactor's before and after.

    python scripts/bench_trees.py BEFORE_TREE AFTER_TREE STORE [ROUNDS]

Each tree is a checkout with its C extension built (`python setup.py build_ext --inplace`);
STORE holds a base named `smollm2` (the bundled SmolLM2). Per round, each tree in turn (the
order alternating): `slm run -n 128` decode tok/s, the prefill of a ~460-token prompt (a new
prompt each round: the prompt cache never answers), `slm activate` wall time, and 8 greedy
completions at once through the tree's own `slm serve` (every figure through the command line
or HTTP, so that trees with different internals compare). Prints each sample and the medians.
"""
import json, os, statistics, subprocess, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_http import concurrent_completions, slm_serve  # noqa: E402

BEFORE, AFTER = sys.argv[1], sys.argv[2]
STORE = Path(sys.argv[3])
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 5
PY = sys.executable
# a run of its own: the store's prompt cache never answers a prompt an earlier run wrote
RUN = f"{time.time_ns():x}"
WORDS = "the quick brown fox jumps over a lazy dog while seven small birds sing in the old oak tree".split()


def env(tree):
    return {**os.environ, "PYTHONPATH": tree}  # as users run it: the default OpenMP wait policy


def slm(tree, *args):
    t = time.perf_counter()
    r = subprocess.run([PY, "-m", "slm", "--store", str(STORE), *args], env=env(tree), capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{tree}: {args}: {r.stderr}")
    return r.stdout, time.perf_counter() - t


def batching(tree):
    """8 greedy completions at once through the tree's own `slm serve` (the scheduler's batched
    step, over HTTP: the same request whatever the engine's internals are)."""
    with slm_serve(STORE, max_batch=8, env=env(tree)) as url:
        prompts = [f"Chapter {i + 1}. Once upon a time," for i in range(8)]
        concurrent_completions(url, ["active"] * 8, prompts, 8)  # warm: staged, prompts cached
        return concurrent_completions(url, ["active"] * 8, prompts, 64)["tok_s"]


def sample(tree, rnd):
    out = {}
    prompt = f"Round {rnd} {tree[-4:]} {RUN}: Once upon a time,"
    j = json.loads(slm(tree, "run", prompt, "-n", "128", "--json")[0])
    out["decode_tok_s"] = j["timings"]["decode_tok_s"]
    long = " ".join(WORDS[(rnd + i) % len(WORDS)] for i in range(460)) + f" {rnd} {tree[-4:]} {RUN}"
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
