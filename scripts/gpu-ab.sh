#!/usr/bin/env bash
# gpu-ab.sh — this tree (A) against other branches (B...) in ONE device call, so that a branch
# written without a GPU is tested and measured beside main in the same session on the same GPU.
#
#   here:       scripts/gpu-ab.sh prepare BRANCH...   # git archive of each branch into ab/BRANCH/
#   device:     scripts/gpu-ab.sh run                 # (through the device tool; ab/ travels as
#                                                     #  untracked files)
#   here:       scripts/gpu-ab.sh clean               # remove ab/ (never commit it)
#
# run: builds A and every ab/*/ in parallel (scripts/gpu-test.sh build in each), then for each
# tree in turn runs the GPU tests named in AB_TESTS (default: test_cuda_qmatmul test_cuda_target),
# (only in the trees named in AB_TESTS_ON, e.g. "A next-fuse", when it is set),
# compute-sanitizer memcheck on their --quick runs (each under AB_TEST_TIMEOUT seconds, 240), the benchmark commands of AB_BENCH (separated
# by ';', each with its arguments; default: build-gpu/cuda_bench_mm; none: no benchmark) and the end-to-end run of
# AB_E2E (default: ar, chain and tree at the budgets AB_BUDGETS (16,32), T = 0, 5 prompts, no
# Hugging Face; AB_E2E_EXTRA: more generate flags).  Exit status 1 when a build or a test failed.
# Writes $OUT/ab-<tree>.md per tree and $OUT/ab-summary.txt (each test's exit status, the e2e
# table) for the comparison.  Set AB_E2E=none to skip the e2e.
set -uo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-}
shift || true
case $cmd in
  prepare)
    [ $# -ge 1 ] || { echo "usage: scripts/gpu-ab.sh prepare BRANCH..."; exit 2; }
    for b in "$@"; do
      git rev-parse --verify -q "$b^{commit}" > /dev/null || { echo "gpu-ab: no branch or commit '$b'"; exit 2; }
      d="ab/$(echo "$b" | tr -c 'A-Za-z0-9_.\n-' '_')"
      rm -rf "$d" && mkdir -p "$d"
      # models/, train/ and tests/fixtures/ come from A (linked at run time): the archive stays
      # small (the device tool carries 64 MiB in all); a branch that changes fixtures says so
      git diff --quiet main "$b" -- tests/fixtures || echo "gpu-ab: warning: $b changes tests/fixtures; A's are used"
      git archive --format=tar "$b" -- . ':!models' ':!train' ':!tests/fixtures' | tar -x -C "$d" || exit 1
      echo "gpu-ab: $b -> $d ($(du -sh "$d" | cut -f1))"
    done
    exit 0 ;;
  clean) rm -rf ab; exit 0 ;;
  run) ;;
  *) echo "usage: scripts/gpu-ab.sh prepare BRANCH... | run | clean"; exit 2 ;;
esac

OUT=${OUT:-gpu-out}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
TESTS=${AB_TESTS:-test_cuda_qmatmul test_cuda_target}
BENCH=${AB_BENCH:-build-gpu/cuda_bench_mm}
E2E=${AB_E2E:-default}
TMO=${AB_TEST_TIMEOUT:-240} # a test that hangs (a grid barrier never met) ends as exit 124
trees=(.)
for d in ab/*/; do [ -d "$d" ] && trees+=("${d%/}"); done
name_of() { [ "$1" = . ] && echo A || basename "$1"; }
summary=$OUT/ab-summary.txt
: > "$summary"
t0=$(date +%s)

# builds: A first unpacks the .gpudeps packages other trees then share (/tmp/ddt-deps)
pids=()
for t in "${trees[@]}"; do
  if [ "$t" != . ]; then
    ln -sfn "$PWD/models" "$t/models"
    ln -sfn "$PWD/tests/fixtures" "$t/tests/fixtures"
    ln -sfn "$PWD/.gpudeps" "$t/.gpudeps" 2>/dev/null
    sleep 15
  fi
  ( cd "$t" && OUT=/tmp/ab-out bash scripts/gpu-test.sh build > /tmp/ab-build-$(name_of "$t").log 2>&1 ) & pids+=($!)
done
for i in "${!pids[@]}"; do
  n=$(name_of "${trees[$i]}")
  if wait "${pids[$i]}"; then echo "$n: build ok" >> "$summary"
  else echo "$n: BUILD FAILED" >> "$summary"; tail -20 /tmp/ab-build-$n.log >> "$summary"; fi
done
echo "builds done at $(( $(date +%s) - t0 )) s" >> "$summary"

for t in "${trees[@]}"; do
  n=$(name_of "$t")
  [ -x "$t/build-gpu/ddtree" ] || continue
  log=$OUT/ab-$n.md
  (
    cd "$t"
    tests=$TESTS
    [ -n "${AB_TESTS_ON:-}" ] && [[ " $AB_TESTS_ON " != *" $n "* ]] && tests=
    for x in $tests; do
      [ -x "build-gpu/$x" ] || { echo "$n: $x absent from this tree" >> "$summary"; continue; }
      echo "== $x"
      timeout "$TMO" build-gpu/$x > /tmp/ab-$n-$x.log 2>&1; r=$?
      grep -m 20 FAIL /tmp/ab-$n-$x.log; tail -2 /tmp/ab-$n-$x.log
      echo "$n: $x exit $r" >> "$summary"
      timeout "$TMO" compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/$x --quick > /tmp/ab-$n-$x-san.log 2>&1; r=$?
      tail -1 /tmp/ab-$n-$x-san.log
      echo "$n: memcheck $x --quick exit $r" >> "$summary"
    done
    if [ "$BENCH" != none ]; then
      IFS=';' read -ra benches <<< "$BENCH"
      for b in "${benches[@]}"; do echo "== $b"; eval "$b" 2>&1; done
    fi
    if [ "$E2E" != none ]; then
      N_PROMPTS=5 BUDGETS=${AB_BUDGETS:-16,32} TEMPS=0 NO_HF=1 OUT=/tmp/ab-e2e-$n E2E_NAME=e2e \
        E2E_EXTRA="${AB_E2E_EXTRA:-}" bash scripts/gpu-e2e.sh > /dev/null 2>&1
      echo "== e2e"; cat /tmp/ab-e2e-$n/e2e.md 2>/dev/null
      { echo "$n e2e:"; grep -E '^\| 0 ' /tmp/ab-e2e-$n/e2e.md 2>/dev/null; } >> "$summary"
    fi
  ) > "$log" 2>&1
  echo "$n done at $(( $(date +%s) - t0 )) s" >> "$summary"
done
cat "$summary"
! grep -qE "exit [1-9]|BUILD FAILED" "$summary"
