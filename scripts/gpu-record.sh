#!/usr/bin/env bash
# gpu-record.sh — the numbers the open issues are judged by, in one device call, on whatever card
# the device tool lends (the H100 and the H200 give different ratios: record which one ran):
#   - issue 12's K2.6 layer: cuda_bench_k26 --tc, twice (its graph + PDL column, the floor, the
#     61-layer projection);
#   - the INT4 experts: cuda_bench_moe 12 experts-nt (the graph + PDL column: as the engine runs them);
#   - the dense products: cuda_bench_moe 12 bf16 (the presplit columns: as the layer runs them);
#   - an SM's read rate against its bytes in flight: cuda_bench_inflight (the experts' stream geometry);
#   - the tree-verify attention alone: cuda_bench_mla --quick (plain graph and with PDL, the floor);
#   - issue 13's end to end: bench/e2e.py on the shipped pair at T = 0 and 1 (Hugging Face generate
#     too where torch and transformers are installed, else --no-hf).
#
#   here:    scripts/gpu-local.sh pack rec build cuda_bench_k26 cuda_bench_moe ddtree cuda_bench_inflight cuda_bench_mla
#   device:  scripts/gpu-record.sh          (through the device tool; REQUIRE=H200 runs nothing
#                                             unless nvidia-smi names that card)
# Writes $OUT/record-card.log, -k26.log, -moe.log, -dense.log, -inflight.log, -mla.log, -e2e.log.  Each step has a timeout
# that keeps the whole under one 10-minute device command.  Exit status: 2 without $OUT or the pack,
# 0 otherwise (the logs say what failed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-}
[ -n "$OUT" ] || { echo "gpu-record: \$OUT is not set (the device tool sets it)"; exit 2; }
PACK=${REC_PACK:-rec}
L=scripts/gpu-local.sh
C=$OUT/record-card.log
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$C" 2>&1
if [ -n "${REQUIRE:-}" ] && ! grep -q "$REQUIRE" "$C"; then
  echo "gpu-record: not a $REQUIRE: nothing run" | tee -a "$C"
  exit 0
fi
for r in 1 2; do
  { echo "==== cuda_bench_k26 --tc, round $r (t=$SECONDS)"; $L run "$PACK" 'timeout 90 $DDT_BIN/cuda_bench_k26 --tc'; } \
    >> "$OUT/record-k26.log" 2>&1
done
$L run "$PACK" 'timeout 60 $DDT_BIN/cuda_bench_moe 12 experts-nt' > "$OUT/record-moe.log" 2>&1
$L run "$PACK" 'timeout 90 $DDT_BIN/cuda_bench_moe 12 bf16' > "$OUT/record-dense.log" 2>&1
$L run "$PACK" 'timeout 60 $DDT_BIN/cuda_bench_inflight' > "$OUT/record-inflight.log" 2>&1
$L run "$PACK" 'timeout 60 $DDT_BIN/cuda_bench_mla --quick' > "$OUT/record-mla.log" 2>&1
HF=--no-hf
python3 -c 'import torch, transformers' 2> /dev/null && HF=
$L run "$PACK" "timeout 240 python3 bench/e2e.py --build \$DDT_BIN --backend cuda --model models/pystdlib-target \
  --draft models/pystdlib-dflash --prompts models/heldout_prompts.json --max-tokens 128 --budgets 16,20,auto \
  --temperatures 0,1 --n-prompts 5 $HF" > "$OUT/record-e2e.log" 2>&1
echo "t=$SECONDS end" >> "$C"
exit 0
