#!/usr/bin/env bash
# The main job on the bundled SmolLM2: a fresh store, import the real base, show it, and
# import it again to show that nothing new is stored, then generate text.
set -euo pipefail
cd "$(dirname "$0")/.."
export SLM_STORE="$PWD/.demo/store"
rm -rf .demo && mkdir -p .demo

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

GGUF=$(python scripts/smollm2_path.py)
step slm init
step slm import base "$GGUF" --name smollm2
step slm ls
slm show smollm2 > .demo/show.txt
printf '\n\033[1m$ slm show smollm2 | head -n 16\033[0m\n'; head -n 16 .demo/show.txt
echo "... ($(grep -c 'blk\.\|token_embd\|output_norm' .demo/show.txt) tensor rows)"
step slm import base "$GGUF" --name smollm2
step slm run --base smollm2 --max-tokens 24 "Once upon a time, in a small village,"
step slm run --base smollm2 --max-tokens 24 --chat "What is the capital of France?"
echo
echo "demo finished: store at $SLM_STORE"
