#!/usr/bin/env bash
# gpu-test.sh — builds and runs the CUDA tests and benchmarks on a machine with an
# NVIDIA GPU (the H200 lent by the device tool), with nvcc and gcc only, so it needs
# none of the Debian -dev packages.  Writes logs to $OUT (or ./gpu-out).
#   scripts/gpu-test.sh            tests, compute-sanitizer, benchmarks
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT" build-gpu
CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
CFLAGS="-std=c11 -O2 -Wall -Wextra -Werror -Wno-unused-parameter -ffp-contract=off -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -I$CUDA_HOME/include"
NVFLAGS="-std=c++17 -O2 -arch=sm_90 --fmad=false -Iinclude -Isrc -Xcompiler -Wall"
LIBS="-L$CUDA_HOME/lib64 -lcudart -lm -lstdc++ -lpthread -ldl -lrt"
set -e
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for f in src/backend/cuda/*.cu; do nvcc $NVFLAGS -c "$f" -o "build-gpu/$(basename "$f" .cu).o"; done
CORE="src/core/*.c"
gcc $CFLAGS tests/cuda/test_cuda_tree.c $CORE build-gpu/*.o $LIBS -o build-gpu/test_cuda_tree
gcc $CFLAGS tests/cuda/test_cuda_kv.c $CORE build-gpu/*.o $LIBS -o build-gpu/test_cuda_kv
gcc $CFLAGS bench/cuda_bench_tree.c $CORE build-gpu/*.o $LIBS -o build-gpu/cuda_bench_tree
set +e
rc=0
build-gpu/test_cuda_tree 2>&1 | tee "$OUT/test_cuda_tree.log"; rc=$((rc | PIPESTATUS[0]))
build-gpu/test_cuda_kv 2>&1 | tee "$OUT/test_cuda_kv.log"; rc=$((rc | PIPESTATUS[0]))
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/test_cuda_tree --quick 2>&1 | tail -5 | tee "$OUT/sanitizer.log"
  rc=$((rc | PIPESTATUS[0]))
  compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/test_cuda_kv 2>&1 | tail -3 | tee -a "$OUT/sanitizer.log"
  rc=$((rc | PIPESTATUS[0]))
else
  echo "compute-sanitizer not found" | tee "$OUT/sanitizer.log"; rc=1
fi
build-gpu/cuda_bench_tree 1000 2>&1 | tee "$OUT/bench_tree.md"; rc=$((rc | PIPESTATUS[0]))
echo "gpu-test: exit $rc"
exit $rc
