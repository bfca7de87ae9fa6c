#!/usr/bin/env bash
# gpu-sampling.sh — ar, chain and tree (budget 32) with the shipped pair on the GPU at
# T = 0 and T = 1, each at T = 1 with the device sampler (inside the round's graph) and
# with the host sampler (--host-sampler: logits copied to the host every round): tokens/s
# and mean acceptance, median of 3 runs of 128 tokens from examples/heldout_prompt.py.
# Prints a markdown table.  Needs build-gpu/ddtree (scripts/gpu-test.sh build).
set -uo pipefail
cd "$(dirname "$0")/.."
D=build-gpu/ddtree
run() { # mode budget temperature extra...
  local mode=$1 budget=$2 t=$3; shift 3
  for r in 1 2 3; do
    $D generate --model models/pystdlib-target --draft models/pystdlib-dflash --backend cuda --mode "$mode" \
       --budget "$budget" --temperature "$t" --seed 11 --prompt-file examples/heldout_prompt.py --max-tokens 128 \
       --json "$@" 2>/dev/null
  done | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
tps = sorted(r["stats"]["tokens_per_s"] for r in rows)
tau = rows[0]["stats"]["mean_acceptance"] if rows else 0
print("%.0f %.2f" % (tps[len(tps) // 2] if tps else 0, tau))'
}
echo "| mode | T | sampler | tokens/s | mean acceptance |"
echo "|---|---:|---|---:|---:|"
for m in ar chain tree; do
  read -r a b <<<"$(run $m 32 0)"; echo "| $m | 0 | argmax | $a | $b |"
  read -r a b <<<"$(run $m 32 1)"; echo "| $m | 1 | device | $a | $b |"
  read -r a b <<<"$(run $m 32 1 --host-sampler)"; echo "| $m | 1 | host | $a | $b |"
done
