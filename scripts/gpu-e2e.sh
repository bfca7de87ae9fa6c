#!/usr/bin/env bash
# gpu-e2e.sh — the end-to-end benchmark on the GPU: `ddtree generate --backend cuda`
# in ar, chain and tree (budgets 8..256) at T = 0 and T = 1 on the held-out prompts
# of the shipped pair, plus Hugging Face generate on the same GPU (bench/e2e.py).
# Writes $OUT/e2e_gpu.md and $OUT/e2e_gpu.png (or $E2E_NAME.*).  Builds first if needed.
# Env: N_PROMPTS, BUDGETS, MAX_AUTO, TEMPS (0,1), E2E_EXTRA (more generate flags, e.g.
# --no-pdl), NO_HF=1 (skip Hugging Face), E2E_NAME.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
[ -x build-gpu/ddtree ] || bash scripts/gpu-test.sh build || exit 1
export PYTHONUNBUFFERED=1
python3 bench/e2e.py --build build-gpu --backend cuda --model models/pystdlib-target \
    --draft models/pystdlib-dflash --prompts models/heldout_prompts.json --max-tokens 128 \
    --n-prompts "${N_PROMPTS:-8}" --budgets "${BUDGETS:-8,16,32,64,128,256,auto}" --max-auto-budget "${MAX_AUTO:-64}" --out-md "$OUT/${E2E_NAME:-e2e_gpu}.md" --out-png "$OUT/${E2E_NAME:-e2e_gpu}.png" \
    --temperatures "${TEMPS:-0,1}" ${E2E_EXTRA:+"--extra-args=$E2E_EXTRA"} ${NO_HF:+--no-hf}
