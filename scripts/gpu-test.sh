#!/usr/bin/env bash
# gpu-test.sh — builds ddtree with the CUDA backend and runs the GPU tests and
# benchmarks on a machine with an NVIDIA GPU (the H200 lent by the device tool),
# with nvcc and gcc only (scripts/gpu-env.sh supplies jansson and PCRE2 from
# .gpudeps/), so it needs no Debian -dev package there.  Everything is logged to
# $OUT/gpu-test.log (tests) and $OUT/bench.md (benchmarks).
#   scripts/gpu-test.sh [build|test|quicktest|sanitize|sweep|diag|bench|bench-experts|ncu-dense]...
#                                                   (default: build test)
#   test = every GPU test, then compute-sanitizer memcheck on each one's --quick
#   run and racecheck on the wgmma experts (test_cuda_moe --quick --racecheck: the cases
#   without cluster launches, where racecheck stops with an internal error; ~60 s on an
#   H100); quicktest = the tests alone; sanitize = the sanitizer alone; sweep = the
#   fast-attention check over 48 random trees; diag = test_cuda_target
#   --diag-fast on failing seeds of the sweep ($DIAG_SEEDS; the report in
#   $OUT/diag.log, a verdict per seed on the terminal); bench-experts = the
#   expert kernels by work-item size; ncu-dense = Nsight Compute sections of the dense kernel at
#   64 tokens (LM head, q_b, o_proj) into $OUT/ncu-dense.txt; k26 = the K2.6 slice
#   with tensor cores (every n, N <= 4096); ncu-full = Nsight Compute's full section set on every
#   kernel of one MoE layer's verify at n = $NCU_FULL_N (default 1; $OUT/ncu-full-N.txt); ncu-layer = every kernel's time in one
#   MoE layer's verify at n = 1 and 32 ($OUT/ncu-layer-N.csv, listed in launch order in
#   ncu-layer-N.md: scripts/ncu-sum.py --launches); ncu-round = every kernel's time in
#   a short generate of the shipped pair (ar, tree 64, tree 64 at T = 1: $OUT/ncu-round-*.csv.gz,
#   summed per kernel by scripts/ncu-sum.py into $OUT/ncu-round-sum.md).
# Exit status: non-zero when any test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
B=${GPU_TEST_BUILD:-build-gpu}   # gpu-local.sh run: GPU_TEST_BUILD=$DDT_BIN (binaries built here)
mkdir -p "$OUT" $B/obj
source scripts/gpu-env.sh
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(build test)
rc=0

build() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  ddt_nvcc_objs $B/obj || return 1
  local f pids=()
  for f in src/core/*.c src/io/*.c src/text/*.c src/backend/cpu/*.c src/model/*.c src/engine/*.c; do
    local o=$B/obj/$(basename "$(dirname "$f")")_$(basename "$f" .c).o
    gcc $CFLAGS -DDDT_HAVE_CUDA=1 -c "$f" -o "$o" & pids+=($!)
  done
  local p; for p in "${pids[@]}"; do wait "$p" || return 1; done
  rm -f $B/libddt.a
  ar rcs $B/libddt.a $B/obj/*.o
  gcc $CFLAGS tools/*.c $B/libddt.a $LIBS -o $B/ddtree || return 1
  pids=()
  for f in tests/cuda/test_*.c bench/cuda_bench_*.c; do
    # a test's reference kernels (tests/cuda/<test>_ref.cu) join it, built with NVFLAGS
    local ref="${f%.c}_ref.cu" extra=""
    if [ -f "$ref" ]; then extra=$B/obj-ref/$(basename "$ref" .cu).o; fi
    ( if [ -n "$extra" ]; then mkdir -p $B/obj-ref && nvcc $NVFLAGS -c "$ref" -o "$extra" || exit 1; fi
      gcc $CFLAGS "$f" $extra $B/libddt.a $LIBS -o $B/$(basename "$f" .c) ) & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  echo "build: ok"
}

run_test() { # name [args]
  local n=$1; shift
  echo "== $n $*"
  $B/$n "$@" 2>&1; local r=$?
  [ $r -ne 0 ] && echo "FAILED: $n (exit $r)"
  return $r
}

tests_only() {
  local r=0 f n
  for f in tests/cuda/test_*.c; do
    n=$(basename "$f" .c)
    run_test "$n" || r=1
  done
  return $r
}

sanitize_all() {
  local r=0 f n
  if command -v compute-sanitizer >/dev/null; then
    for f in tests/cuda/test_*.c; do
      n=$(basename "$f" .c)
      echo "== compute-sanitizer $n --quick"
      compute-sanitizer --tool memcheck --error-exitcode 9 $B/$n --quick > $B/sanitizer.log 2>&1
      local s=$?; tail -2 $B/sanitizer.log
      [ $s -ne 0 ] && { echo "FAILED: sanitizer $n (exit $s)"; grep -m 20 "FAIL" $B/sanitizer.log; tail -30 $B/sanitizer.log; r=1; }
    done
    echo "== compute-sanitizer racecheck test_cuda_moe --quick --racecheck (wx_kernel)"
    compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name kns=wx_kernel $B/test_cuda_moe --quick \
      --racecheck > $B/sanitizer.log 2>&1
    local s=$?; tail -2 $B/sanitizer.log
    [ $s -ne 0 ] && { echo "FAILED: racecheck test_cuda_moe (exit $s)"; tail -30 $B/sanitizer.log; r=1; }
  else
    echo "FAILED: compute-sanitizer not found"; r=1
  fi
  return $r
}

test_all() {
  local r=0
  tests_only || r=1
  sanitize_all || r=1
  return $r
}

ncu_dense() {
  local what
  for what in "LM head" "bf16 q_b_proj" "o_proj"; do
    echo "== ncu: $what, 64 tokens"
    ncu --clock-control none --kernel-name regex:ws_kernel --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --section ComputeWorkloadAnalysis \
        $B/cuda_bench_moe 20 "$what" 64 2>&1 | grep -v "^==PROF==" | tail -120
  done
}

bench_all() {
  local f
  for f in bench/cuda_bench_*.c; do
    n=$(basename "$f" .c)
    echo "== $n"
    $B/$n 2>&1
  done
  echo "== bench/mla_torch.py (plain PyTorch baseline for cuda_bench_mla)"
  PYTHONUNBUFFERED=1 python3 bench/mla_torch.py 2>&1
}

for s in "${steps[@]}"; do
  case $s in
    build) build > $B/build.log 2>&1 || { tail -50 $B/build.log; echo "gpu-test: build failed"; exit 1; } ;;
    test) test_all 2>&1 | tee -a "$OUT/gpu-test.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1 ;;
    quicktest) tests_only 2>&1 | tee -a "$OUT/gpu-test.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1 ;;
    sanitize) sanitize_all 2>&1 | tee -a "$OUT/gpu-test.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1 ;;
    sweep) run_test test_cuda_target --sweep-fast ${SWEEP_N:-48} 2>&1 | tee -a "$OUT/sweep.log"; [ ${PIPESTATUS[0]} -eq 0 ] || rc=1 ;;
    diag) run_test test_cuda_target --diag-fast ${DIAG_SEEDS:-0x40ec3ac8f29e0dc5 0x03b0eb23c70e66df 0xa42708883fcbcb0e \
        0x29b0693de8ac7d42 0x8ceb36fd35da3a8b} > "$OUT/diag.log" 2>&1 || rc=1; grep '^diag-fast' "$OUT/diag.log" ;;
    bench-experts) $B/cuda_bench_moe 20 experts-nt 2>&1 | tee -a "$OUT/bench-experts.md" ;;
    ncu-dense) ncu_dense > "$OUT/ncu-dense.txt" 2>&1; tail -5 "$OUT/ncu-dense.txt" ;;
    k26) $B/cuda_bench_k26 --tc 2>&1 | tee -a "$OUT/k26.md" ;;
    ncu-layer) for n in 1 32; do
        # caches not flushed between kernels (the layer's activations stay in L2, as they do
        # when it runs; its weights are far larger than L2 either way)
        ncu --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum \
            --csv $B/cuda_bench_k26 --profile $n > "$OUT/ncu-layer-$n.csv" 2>&1
        python3 scripts/ncu-sum.py --launches "$OUT/ncu-layer-$n.csv" | tee "$OUT/ncu-layer-$n.md"
      done ;;
    ncu-full) for n in ${NCU_FULL_N:-1}; do
        # every kernel of one MoE layer's verify with the full section set (throughput, warp
        # stalls, memory chart, source counters): why each small kernel takes what it takes
        ncu --clock-control none --cache-control none --profile-from-start off --set full \
            $B/cuda_bench_k26 --profile $n 2>&1 | grep -v '^==PROF==' > "$OUT/ncu-full-$n.txt"
        grep -E '^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy' \
            "$OUT/ncu-full-$n.txt" | head -200
      done ;;
    ncu-round) for m in "ar" "tree --budget 64" "tree --budget 64 --temperature 1"; do
        echo "== ncu-round: $m"
        # every kernel of a short generate (prefill, capture and ~10 graph-replayed rounds): the
        # per-kernel GPU time of a round, to set against the round's wall time
        ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
            $B/ddtree generate --backend cuda --model models/pystdlib-target --draft models/pystdlib-dflash \
            --prompt "def parse_args(argv):" --max-tokens 40 --json --mode $m 2>&1 | grep -v '^==PROF==' \
            | gzip > "$OUT/ncu-round-$(echo $m | tr -c 'a-z0-9\n' '_').csv.gz"
        $B/ddtree generate --backend cuda --model models/pystdlib-target --draft models/pystdlib-dflash \
            --prompt "def parse_args(argv):" --max-tokens 40 --json --mode $m | tail -c 1500
      done 2>&1 | tee -a "$OUT/ncu-round.log"
      python3 scripts/ncu-sum.py "$OUT"/ncu-round-*.csv.gz > "$OUT/ncu-round-sum.md" 2>&1
      # the timeline inside the graph (start and end of every kernel node): the gaps between kernels
      if command -v nsys >/dev/null; then
        nsys profile -f true -o /tmp/ddt-round --cuda-graph-trace=node $B/ddtree generate --backend cuda \
            --model models/pystdlib-target --draft models/pystdlib-dflash --prompt "def parse_args(argv):" \
            --max-tokens 40 --mode tree --budget 64 > /dev/null 2>&1
        nsys stats -q --report cuda_gpu_trace --format csv /tmp/ddt-round.nsys-rep 2>&1 | gzip > "$OUT/nsys-tree64.csv.gz"
      else echo "ncu-round: no nsys on this machine" | tee -a "$OUT/ncu-round.log"; fi ;;
    bench) bench_all 2>&1 | tee -a "$OUT/bench.md" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
echo "gpu-test: exit $rc"
exit $rc
