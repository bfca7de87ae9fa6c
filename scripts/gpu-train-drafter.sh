#!/usr/bin/env bash
# gpu-train-drafter.sh — the drafter recipe of train/README.md in one device call:
# the target's continuations once (a shared cache: greedy, plus a SAMPLED_FRAC share
# sampled at T = 1, plus the held-out prompts both ways), then one drafter per name
# in VARIANTS side by side, each for SECONDS_TRAIN of training (evaluations included),
# all 4 layers fed by target layers 1-4 (the shipped shape), exported by --select.
# Needs train/data (carried: python3 train/prepare_data.py collect && ... encode
# --tokenizer models/pystdlib-target).  Writes $OUT/<variant>/ (config.json +
# model.safetensors, the format the engine loads), $OUT/<variant>_train_metrics.json
# and the logs $OUT/gen.out, $OUT/<variant>.out; a summary on stdout.
#
# Variants (the loss; all train on the same mixed greedy/sampled continuations):
#   kd    soft labels only: cross-entropy against the target's full distribution (T = 1)
#   mix   half soft, half hard labels
#   hard  hard labels only (the target's own tokens), as the shipped drafter
# The first variant also evaluates COMPARE (the shipped drafter) on the same held-out sets.
#
# Environment (defaults: ~280 s of training, about 6-6.5 min in all on an H200):
#   OUT=gpu-out SECONDS_TRAIN=280 EVAL_SECONDS=35 PROMPTS=32768 SAMPLED_FRAC=0.5
#   HELDOUT=256 VARIANTS="kd hard" SELECT=chain (chain|t1|both|loss, see train_drafter.py)
#   COMPARE=models/pystdlib-dflash (empty: none)
#   INIT="" (an exported drafter of the shipped shape to continue from: --init, training runs only)
#   EXTRA="" (more train_drafter.py arguments for every run; EXTRA=--tiny SECONDS_TRAIN=20 EVAL_SECONDS=10
#   is a CPU smoke test of this script)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
S=${SECONDS_TRAIN:-280}
EV=${EVAL_SECONDS:-35}
N=${PROMPTS:-32768}
FRAC=${SAMPLED_FRAC:-0.5}
HO=${HELDOUT:-256}
VARIANTS=${VARIANTS:-kd hard}
SELECT=${SELECT:-chain}
COMPARE=${COMPARE-models/pystdlib-dflash}
EXTRA=${EXTRA:-}
INIT=${INIT:-}
D=/tmp/ddt_seq.pt
mkdir -p "$OUT"
A="--target models/pystdlib-target --prompts $N --heldout-prompts $HO --sampled-frac $FRAC --gen-batch 4096
   --feature-batch 512 --data-cache $D --seconds $S --eval-seconds $EV --select $SELECT $EXTRA"
SHAPE="--layers 4 --intermediate 1024 --target-layers 1,2,3,4${INIT:+ --init $INIT}"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 train/train_drafter.py $A --generate-only > "$OUT/gen.out" 2>&1 || { tail -n 30 "$OUT/gen.out"; exit 1; }
echo "generation: $(( $(date +%s) - t0 )) s"; grep -E "generated|written" "$OUT/gen.out"
pids=(); names=(); first=1
for v in $VARIANTS; do
    case $v in
        kd) L="--kd-weight 1" ;;
        mix) L="--kd-weight 0.5" ;;
        hard) L="--kd-weight 0" ;;
        *) echo "unknown variant $v (kd, mix, hard)"; exit 2 ;;
    esac
    C=""; if [ $first = 1 ] && [ -n "$COMPARE" ]; then C="--compare $COMPARE"; fi; first=0
    python3 train/train_drafter.py $A $SHAPE $L $C --out "$OUT/$v" --metrics "$OUT/${v}_train_metrics.json" \
        > "$OUT/$v.out" 2>&1 & pids+=($!); names+=("$v")
done
r=0
for i in "${!pids[@]}"; do wait "${pids[$i]}" || { r=1; echo "${names[$i]} failed:"; tail -n 20 "$OUT/${names[$i]}.out"; }; done
echo "training: $(( $(date +%s) - t0 )) s in all, exit $r"
for v in $VARIANTS; do
    f="$OUT/${v}_train_metrics.json"
    [ -f "$f" ] && python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(sys.argv[2], 'steps', m['steps'],
'best step', m['best']['step'], 'exported', m['exported']); m['compare'] and print('compare', m['compare'])" "$f" "$v"
done
exit $r
