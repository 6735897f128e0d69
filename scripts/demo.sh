#!/usr/bin/env bash
# The main job on the bundled SmolLM2: a fresh store, the real base imported, an adapter
# switched on and off as an overlay, a rollback, and a check that the base answer comes back
# byte for byte.
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
step slm run --max-tokens 24 --chat "What is the capital of France?"
show slm run --max-tokens 24 "$PROMPT" "|" tee .demo/base.txt
slm run --max-tokens 24 "$PROMPT" | tee .demo/base.txt

# Two adapters in PEFT's format (random LoRAs made with NumPy; see scripts/make_random_lora.py).
python scripts/make_random_lora.py .demo/noisy --seed 1 >/dev/null
python scripts/make_random_lora.py .demo/noisy2 --seed 2 --std 0.03 >/dev/null
step slm import adapter .demo/noisy --name noisy
step slm import adapter .demo/noisy2 --name noisy2
step slm activate smollm2 noisy
step slm run --max-tokens 24 "$PROMPT"
step slm activate smollm2 noisy@0.5 noisy2
step slm status
step slm run --max-tokens 24 "$PROMPT"
step slm log
step slm rollback -n 2
show slm run --max-tokens 24 "$PROMPT" "|" tee .demo/again.txt
slm run --max-tokens 24 "$PROMPT" | tee .demo/again.txt
if cmp -s .demo/base.txt .demo/again.txt; then
  echo "after the rollback the base answers byte for byte as before"
else
  echo "MISMATCH: the base answer changed after the rollback" >&2
  exit 1
fi
step slm fsck
echo
echo "demo finished: store at $SLM_STORE"
