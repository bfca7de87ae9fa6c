#!/usr/bin/env bash
# gpu-train-drafter.sh — the drafter recipe of train/README.md in one device call:
# the target's greedy continuations once (a shared cache), then two drafters side
# by side (2 layers as shipped, and 4 layers fed by target layers 1-4), each for
# SECONDS of training, exported by held-out chain acceptance.  Needs train/data
# (carried: python3 train/prepare_data.py collect && ... encode --tokenizer
# models/pystdlib-target).  Writes $OUT/d2, $OUT/d4 and their metrics; logs on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
S=${SECONDS_TRAIN:-140}
D=/tmp/ddt_seq.pt
A="--target models/pystdlib-target --prompts 32768 --gen-batch 4096 --feature-batch 512 --data-cache $D --seconds $S --eval-seconds 25"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 train/train_drafter.py $A --generate-only > /tmp/gen.out 2>&1 || { tail -n 30 /tmp/gen.out; exit 1; }
echo "generation: $(( $(date +%s) - t0 )) s"; tail -n 3 /tmp/gen.out
python3 train/train_drafter.py $A --out $OUT/d2 --metrics $OUT/d2_train_metrics.json > /tmp/d2.out 2>&1 & p2=$!
python3 train/train_drafter.py $A --layers 4 --intermediate 1024 --target-layers 1,2,3,4 --out $OUT/d4 \
    --metrics $OUT/d4_train_metrics.json > /tmp/d4.out 2>&1 & p4=$!
r=0; wait $p2 || r=1; wait $p4 || r=$((r + 2))
echo "training: $(( $(date +%s) - t0 )) s in all, exit $r"
tail -n 6 /tmp/d2.out /tmp/d4.out
exit $r
