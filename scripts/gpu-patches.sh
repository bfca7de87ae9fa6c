#!/usr/bin/env bash
# gpu-patches.sh — the patches written without a GPU (patches/*.patch), tested and measured in ONE
# device call: every GPU test and compute-sanitizer memcheck on main + all of them, and the K2.6 /
# end-to-end benchmarks of main, main + all, and main + all but each patch named in GPU_PATCH_AB
# (the ones that may lose; default: none), side by side on the same GPU, and the patched build's
# benchmarks again under each environment setting in GPU_PATCH_ENV (e.g. "DDT_AR_FALLBACK_DECAY=0.9";
# default: none).
#
#   here:    scripts/gpu-patches.sh prepare    # builds each tree in a worktree (sm_90a), packs its
#                                              # binaries (scripts/gpu-local.sh), all trees merged
#                                              # into one archive, ab/all.tar.xz
#   device:  scripts/gpu-patches.sh run [tests|bench]   # through the device tool; writes
#                                              # $OUT/patches-*.log (no phase: both; each phase
#                                              # alone fits one 10-minute device command)
#   here:    scripts/gpu-ab.sh clean           # remove ab/ (never commit it)
#
# Then land each patch that is green (and, for the A/B ones, faster): git apply, commit, delete it.
# Exit status: prepare 1 when a patch does not apply or a build fails; run 1 when a test failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
AB=${GPU_PATCH_AB:-}
ENVS=${GPU_PATCH_ENV-}
BINS="ddtree cuda_bench_k26 cuda_bench_moe cuda_bench_mla $(cd tests/cuda && ls test_cuda_*.c | sed 's/\.c$//' | tr '\n' ' ')"

# tree NAME, then the patches it holds: a worktree of HEAD with them applied, built and packed
build_tree() {
  local name=$1 wt=/tmp/gpu-patches-$1
  shift
  git worktree remove --force "$wt" 2> /dev/null
  git worktree add -q --detach "$wt" HEAD || return 1
  for p in "$@"; do
    (cd "$wt" && git apply "$OLDPWD/$p") || { echo "gpu-patches: $p does not apply"; return 1; }
  done
  # the fixtures and models the tests read are HEAD's (the patches do not touch them)
  cmake -S "$wt" -B "$wt/build" -DCMAKE_BUILD_TYPE=Release > /dev/null &&
    cmake --build "$wt/build" -j "$(nproc)" > "$wt/build.log" 2>&1 || {
    echo "gpu-patches: $name: build failed (tail of $wt/build.log):"
    tail -20 "$wt/build.log"
    return 1
  }
  # shellcheck disable=SC2086
  scripts/gpu-local.sh pack "$name" "$wt/build" $BINS || return 1
  git worktree remove --force "$wt"
}

case ${1:-} in
  prepare)
    all=(patches/*.patch)
    [ -e "${all[0]}" ] || { echo "gpu-patches: no patches/*.patch"; exit 0; }
    build_tree main || exit 1
    build_tree patched "${all[@]}" || exit 1
    for a in $AB; do
      rest=()
      for p in "${all[@]}"; do [ "$p" = "patches/$a.patch" ] || rest+=("$p"); done
      build_tree "without-$a" "${rest[@]}" || exit 1
    done
    # one solid archive of every tree: per-tree packs (~8 MB each) beside the ~40 MB working tree
    # overflow the device tool's 64 MiB from the third on
    scripts/gpu-local.sh merge || exit 1
    exit 0 ;;
  run)
    OUT=${OUT:-out}
    mkdir -p "$OUT"
    rc=0
    phase=${2:-all}
    case $phase in tests | bench | all) ;; *) echo "gpu-patches: run tests | bench"; exit 2 ;; esac
    if [ "$phase" != bench ]; then
      # main's GPU-vs-CPU engine test alone first: the CPU kernels' arithmetic order changed in the
      # eleventh session, so a failure there is main's, not a patch's
      scripts/gpu-local.sh run main 'timeout 600 $DDT_BIN/test_cuda_target; echo "exit $?"' \
        > "$OUT/patches-main-target.log" 2>&1
      grep -E '^exit [^0]' "$OUT/patches-main-target.log" && rc=1
      # every GPU test on main + all patches, then memcheck on the --quick runs of the ones they touch
      scripts/gpu-local.sh run patched '
        for t in $DDT_BIN/test_cuda_*; do
          echo "== $(basename $t)"; timeout 600 $t; echo "exit $?"
        done' > "$OUT/patches-tests.log" 2>&1
      grep -B1 -E '^exit [^0]' "$OUT/patches-tests.log" && rc=1
      scripts/gpu-local.sh run patched \
        "GPU_TEST_BUILD=\$DDT_BIN OUT=$OUT bash scripts/gpu-test.sh sanitize" > "$OUT/patches-memcheck.log" 2>&1 || rc=1
    fi
    [ "$phase" = tests ] && exit $rc
    # the benchmarks of every tree, one after the other on the same GPU
    for name in main patched $(for a in $AB; do echo "without-$a"; done); do
      scripts/gpu-local.sh run "$name" '
        $DDT_BIN/cuda_bench_k26 --tc; $DDT_BIN/cuda_bench_moe 20 bf16; $DDT_BIN/cuda_bench_mla --quick
        python3 bench/e2e.py --build $DDT_BIN --backend cuda --model models/pystdlib-target \
          --draft models/pystdlib-dflash --prompts models/heldout_prompts.json --max-tokens 128 \
          --budgets 16,32,auto --temperatures 0,1 --no-hf --n-prompts 5' > "$OUT/patches-bench-$name.log" 2>&1
    done
    for v in $ENVS; do
      tag=$(printf '%s' "$v" | tr -c 'A-Za-z0-9' _)
      scripts/gpu-local.sh run patched "$v \$DDT_BIN/cuda_bench_k26 --tc; $v \$DDT_BIN/cuda_bench_moe 20 bf16" \
        > "$OUT/patches-bench-patched-$tag.log" 2>&1
    done
    exit $rc ;;
  *) echo "usage: scripts/gpu-patches.sh prepare | run"; exit 2 ;;
esac
